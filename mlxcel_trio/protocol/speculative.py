"""Speculative decoding settings as they cross the server/engine seam.

`SpecSettings` is the server-wide configuration (--spec-type and friends,
resolved once at startup); `SpecRequest` is what one request asks for
(upstream's per-request ``speculative.*`` fields), already clamped against
the settings.  Both are plain frozen records: the engine reads them, the
server reports them (generation_settings, /props, /slots).
"""

from __future__ import annotations

import attrs

# --spec-type values mlxcel-trio runs (upstream's spellings)
DRAFT_SIMPLE = "draft-simple"
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# the ones mlxcel-trio has a drafter for (engine/speculative/)
IMPLEMENTED_TYPES = (DRAFT_SIMPLE, *NGRAM_TYPES)
# upstream's fixed trial order (common_speculative_init): n-gram lookups first
PRIORITY = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
            DRAFT_SIMPLE)


@attrs.frozen
class NgramSizes:
    """One n-gram drafter's lookup length, draft length and hit floor."""

    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1


@attrs.frozen
class SpecSettings:
    types: tuple[str, ...] = ()         # in upstream's trial order; () = off
    n_max: int = 3                      # --spec-draft-n-max (draft model)
    n_min: int = 0                      # --spec-draft-n-min
    p_min: float = 0.0                  # --spec-draft-p-min (greedy draft)
    draft_model: str | None = None      # -md
    ngram_simple: NgramSizes = NgramSizes()
    ngram_map_k: NgramSizes = NgramSizes()
    ngram_map_k4v: NgramSizes = NgramSizes()
    mod_n_min: int = 48
    mod_n_max: int = 64
    mod_n_match: int = 24
    lookup_static: str | None = None    # -lcs (ngram-cache)
    lookup_dynamic: str | None = None   # -lcd (ngram-cache)

    @property
    def on(self) -> bool:
        return bool(self.types)

    @property
    def names(self) -> str:
        """As upstream reports them (generation_settings' speculative.types)."""
        return ",".join(self.types) or "none"


@attrs.frozen
class SpecRequest:
    """A request's own draft bounds (upstream's speculative.n_max / n_min /
    p_min), defaulting to the server's (SpecSettings' own defaults, the one
    home of these numbers; the command line's are checked against them)."""

    n_max: int = attrs.fields(SpecSettings).n_max.default
    n_min: int = attrs.fields(SpecSettings).n_min.default
    p_min: float = attrs.fields(SpecSettings).p_min.default
