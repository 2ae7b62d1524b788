"""The checkpoint's tokenizer, loaded once and shared read-only.

Built from `tokenizer.json` with the `tokenizers` library directly (no
transformers import on the serving path).  `Vocab` never touches MLX, so the
HTTP layer may call it from the trio thread: tokenizing is fast and pure.
It also holds the checkpoint's other tokenizer-side facts read from its
files: special tokens, end-of-generation ids, the generation defaults, and
the chat template sources (which chat/ renders; nothing here renders them).
"""

from __future__ import annotations

import json
import logging
from contextlib import suppress
from pathlib import Path
from typing import Any, Mapping

from tokenizers import Tokenizer

from ..protocol.records import PromptTooLong
from .detokenizer import TokenTable

log = logging.getLogger("mlxcel.engine")


# The fill-in-the-middle marker spellings llama.cpp's vocabulary loader looks
# for, per role (Qwen, StarCoder-style, Granite, DeepSeek, CodeLlama, ...).
FIM_SPELLINGS: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
            "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
            "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
            "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def _token_text(value) -> str | None:
    """tokenizer_config.json spells special tokens as a string or an
    AddedToken dict; return the text either way."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_id_set(value) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def checkpoint_templates(tokenizer_config: Mapping[str, Any], template_file: str | None) \
        -> tuple[str | None, str | None]:
    """(default, tool_use) template sources of a checkpoint, as transformers
    reads them: `chat_template.jinja` first, then tokenizer_config.json's
    `chat_template` (a string, or a list of {name, template})."""
    default = tool_use = None
    value = tokenizer_config.get("chat_template")
    if isinstance(value, str):
        default = value
    elif isinstance(value, list):
        named = {}
        with suppress(TypeError, KeyError):
            named = {t["name"]: t["template"] for t in value}
        default, tool_use = named.get("default"), named.get("tool_use")
    if template_file is not None:
        default = template_file
    return default, tool_use


# Texts at least this long are tokenized with the GIL released (see tokenize):
# below it the batch call's thread hand-off costs more than it frees.
GIL_FREE_CHARS = 16 * 1024


class Vocab:
    def __init__(self, checkpoint: Path, n_vocab_model: int | None = None) -> None:
        self._tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        # parse_special=false needs a tokenizer that treats special-token
        # spellings as plain text; the flag is per instance, so keep two.
        self._tok_literal = Tokenizer.from_str(self._tok.to_str())
        self._tok_literal.encode_special_tokens = True
        self.table = TokenTable(self._tok)

        tcfg = _read_json(checkpoint / "tokenizer_config.json")
        gcfg = _read_json(checkpoint / "generation_config.json")
        mcfg = _read_json(checkpoint / "config.json")
        # The chat template sources (chat/ renders them; the engine never does);
        # `chat_template_tool_use` is the named "tool_use" one (None when absent).
        template_file = checkpoint / "chat_template.jinja"
        self.chat_template, self.chat_template_tool_use = checkpoint_templates(
            tcfg, template_file.read_text(encoding="utf-8") if template_file.is_file() else None)
        self.bos_token = _token_text(tcfg.get("bos_token"))
        self.eos_token = _token_text(tcfg.get("eos_token"))
        # transformers' special_tokens_map: the named special tokens a chat
        # template sees (bos_token, eos_token, unk_token, pad_token, ...).
        smap = _read_json(checkpoint / "special_tokens_map.json")
        self.special_tokens_map: dict[str, str] = {
            name: text for name in ("bos_token", "eos_token", "unk_token", "sep_token",
                                    "pad_token", "cls_token", "mask_token")
            if (text := _token_text(tcfg.get(name, smap.get(name)))) is not None
        }

        eos = _as_id_set(gcfg.get("eos_token_id")) | _as_id_set(mcfg.get("eos_token_id"))
        if self.eos_token is not None:
            tid = self._tok.token_to_id(self.eos_token)
            if tid is not None:
                eos.add(tid)
        self.eos_ids: frozenset[int] = frozenset(eos)
        self.bos_id: int | None = (
            self._tok.token_to_id(self.bos_token) if self.bos_token else None
        )
        self.n_vocab = n_vocab_model or self._tok.get_vocab_size(with_added_tokens=True)
        self.fim: dict[str, int | None] = {
            role: next((t for t in map(self._tok.token_to_id, names) if t is not None), None)
            for role, names in FIM_SPELLINGS.items()
        }
        probe = self._tok.encode("a", add_special_tokens=True).ids
        self.add_bos = self.bos_id is not None and bool(probe) and probe[0] == self.bos_id
        self._bos_fix: bool | None = None          # override_specials
        self._eos_fix: tuple[bool, int] | None = None
        # Sampling defaults the checkpoint author declared (used when the
        # matching flag is absent; recorded by_design).
        self.generation_defaults = {
            k: gcfg[k] for k in ("temperature", "top_k", "top_p", "min_p") if k in gcfg
        }

    def override_specials(self, add_bos: bool | None, add_eos: bool | None) -> None:
        """--override-kv tokenizer.ggml.add_bos_token / add_eos_token: whether
        a tokenization with special tokens starts with BOS / ends with EOS,
        whatever the tokenizer's post-processor does (None: as it does)."""
        eos = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        for asked, token, key in ((add_bos, self.bos_id, "add_bos_token"),
                                  (add_eos, eos, "add_eos_token")):
            if asked is not None and token is None:
                log.warning("--override-kv tokenizer.ggml.%s is ignored: the tokenizer "
                            "names no such token", key)
        self._bos_fix = add_bos if self.bos_id is not None else None
        self._eos_fix = (add_eos, eos) if add_eos is not None and eos is not None else None
        if self._bos_fix is not None:
            self.add_bos = self._bos_fix

    def _fixed(self, ids: list[int]) -> list[int]:
        """`ids` with the overridden BOS / EOS rule applied (add_special only)."""
        if self._bos_fix is not None:
            has = bool(ids) and ids[0] == self.bos_id
            if self._bos_fix and not has:
                ids = [self.bos_id, *ids]
            elif not self._bos_fix and has:
                ids = ids[1:]
        if self._eos_fix is not None:
            want, eos = self._eos_fix
            has = bool(ids) and ids[-1] == eos
            if want and not has:
                ids = [*ids, eos]
            elif not want and has:
                ids = ids[:-1]
        return ids

    def tokenizer_json(self) -> str:
        """The tokenizer as tokenizer.json text (llguidance builds its own
        tokenizer from it for grammar masks)."""
        return self._tok.to_str()

    # -- text -> ids ---------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True,
                 limit: int | None = None) -> list[int]:
        """The ids of `text`; with `limit`, a text of at least that many
        tokens raises PromptTooLong instead (its ids are never built)."""
        if add_special and (self._bos_fix is not None or self._eos_fix is not None):
            ids = self._fixed(list(self._encode(text, True, parse_special, None)))
            if limit is not None and len(ids) >= limit:
                raise PromptTooLong(len(ids))
            return ids
        return self._encode(text, add_special, parse_special, limit)

    def _encode(self, text: str, add_special: bool, parse_special: bool,
                limit: int | None) -> list[int]:
        tok = self._tok if parse_special else self._tok_literal
        if len(text) < GIL_FREE_CHARS:
            ids = tok.encode(text, add_special_tokens=add_special).ids
            if limit is not None and len(ids) >= limit:
                raise PromptTooLong(len(ids))
            return ids
        # tokenizers' `encode` holds the GIL for the whole call (seconds for a
        # megabyte), freezing every other thread, the event loop included;
        # `encode_batch_fast` releases it while the work runs and skips the
        # offsets nobody reads.  Same ids.  Building the Python list of ids
        # holds the GIL again (a third of a second for ten million), so a
        # text over the limit is refused on its count alone.
        encoding = tok.encode_batch_fast([text], add_special_tokens=add_special)[0]
        if limit is not None and len(encoding) >= limit:
            raise PromptTooLong(len(encoding))
        return encoding.ids

    def single_id(self, text: str) -> int | None:
        """The one token that spells `text` (a special marker such as
        `</think>`, read as such), or None where it takes more or none."""
        ids = self.tokenize(text, add_special=False, parse_special=True)
        return ids[0] if len(ids) == 1 else None

    def tokenize_mixed(self, content, add_special: bool, parse_special: bool = True) -> list[int]:
        """A string, or a list mixing strings and token ids (upstream's
        "mixed" prompt shape).  Only the first string piece gets BOS."""
        if isinstance(content, str):
            return self.tokenize(content, add_special, parse_special)
        out: list[int] = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                out.extend(self.tokenize(part, add_special and i == 0, parse_special))
            else:
                out.append(int(part))
        return out

    def tokenize_pair(self, first: str, second: str) -> tuple[list[int], list[int]]:
        """A cross-encoder input: the two texts in the tokenizer's pair
        template ([CLS] a [SEP] b [SEP], <s> a </s></s> b </s>), special
        spellings read as plain text; its ids and token type ids."""
        enc = self._tok_literal.encode(first, second, add_special_tokens=True)
        return enc.ids, enc.type_ids

    # -- ids -> text -----------------------------------------------------------

    def detokenize(self, ids) -> str:
        return self.table.decode(ids)

    def piece(self, token_id: int) -> bytes:
        return self.table.bytes_of(token_id)

    def is_valid_id(self, token_id: int) -> bool:
        return 0 <= token_id < self.n_vocab
