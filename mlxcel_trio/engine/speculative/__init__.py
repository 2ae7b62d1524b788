"""Speculative decoding inside the continuous batch.

drafters.py proposes (ngram-simple, and the `Chain` that tries the drafters
in upstream's order), ngram_map.py holds the n-gram drafters with memory
(ngram-map-k, ngram-map-k4v, ngram-mod), ngram_cache.py upstream's lookup
decoding over a context table and the -lcs / -lcd files, draft_model.py proposes with a
second model,
batch.py verifies every row's proposal in one target forward, and
rollback.py cuts each row's KV back by its own count.  The scheduler
decides which rows speculate (`Plan`); nothing here knows about jobs.
"""

from __future__ import annotations

from ...protocol.speculative import DRAFT_SIMPLE, SpecSettings
from .drafters import Chain, NgramSimple
from .ngram_map import NgramMap, NgramMod


def build_chain(settings: SpecSettings, draft_model=None) -> Chain | None:
    """The drafters for the configured types (already in upstream's trial
    order, protocol/speculative.PRIORITY); None when off."""
    if not settings.on:
        return None
    drafters = []
    for kind in settings.types:
        if kind == DRAFT_SIMPLE:
            from .draft_model import DraftModel

            drafters.append(DraftModel(draft_model))
        elif kind == "ngram-simple":
            g = settings.ngram_simple
            drafters.append(NgramSimple(g.size_n, g.size_m))
        elif kind in ("ngram-map-k", "ngram-map-k4v"):
            g = settings.ngram_map_k if kind == "ngram-map-k" else settings.ngram_map_k4v
            drafters.append(NgramMap(g.size_n, g.size_m, g.min_hits,
                                     key_only=kind == "ngram-map-k"))
        elif kind == "ngram-mod":
            drafters.append(NgramMod(settings.mod_n_match, settings.mod_n_min,
                                     settings.mod_n_max))
        elif kind == "ngram-cache":
            from .ngram_cache import NgramCache, load_table

            drafters.append(NgramCache(
                load_table(settings.lookup_static) if settings.lookup_static else None,
                load_table(settings.lookup_dynamic) if settings.lookup_dynamic else None))
        else:
            raise ValueError(f"speculative type {kind!r} has no drafter")
    return Chain(drafters)
