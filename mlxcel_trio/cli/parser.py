"""Build argparse from the option table, and merge argv with the environment.

Theory of operation.  argparse only tokenizes: every option is registered
with ``default=SUPPRESS`` and stores its raw string, so after parsing the
namespace holds exactly what the command line said.  `parse` then walks the
table once and, per option, takes the command-line value if there is one,
else the environment variable, else the table default (command line beats
environment, as upstream).  Both sources go through the same value domain, so
`--port abc` and `LLAMA_ARG_PORT=abc` fail with the same kind of line.

Every failure is a `CliError` carrying one line; the entry points print it as
``error: <line>`` on stderr and exit 1.  Nothing here imports anything heavy.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import attrs

from mlxcel_trio.cli.options import OPTIONS, SECTIONS, Option, check_table
from mlxcel_trio.cli.values import BOOL_DOMAIN, BadValue, is_truthy, parse_bool

HELP_WIDTH = 100
NO_EFFECT_MARK = "[accepted; no effect on MLX]"
HELP_COLUMN = 40


class CliError(Exception):
    """Startup errors, one line each; the entry point prints every line after
    "error: ".  Several problems travel together so one run reports them all."""

    def __init__(self, *lines: str) -> None:
        super().__init__(*lines)
        self.lines: tuple[str, ...] = lines

    def __str__(self) -> str:
        return "\n".join(self.lines)

    @classmethod
    def gather(cls, problems: Sequence[CliError]) -> CliError | None:
        """One error carrying every line of `problems`, or None."""
        lines = tuple(line for err in problems for line in err.lines)
        return cls(*lines) if lines else None


@attrs.frozen
class Parsed:
    """The merged result: one typed value per non-action option."""

    values: Mapping[str, Any]
    """dest -> typed value, for every option that is not an action."""
    given: Mapping[str, str]
    """dest -> where an explicit value came from: "argv" or the env var name.
    Options left at their table default are absent."""
    action: str | None = None
    """The dest of an action option on the command line (help, version, ...)."""
    raw: Mapping[str, str] = attrs.field(factory=dict)
    """dest -> the text a value option was given (argv or env), for
    diagnostics; the two arguments of a nargs=2 option are joined by a space."""
    problems: tuple[str, ...] = ()
    """Unknown options and bad values, one line each (see `parse_all`)."""
    argv: tuple[str, ...] = ()
    """The command line as given (a router passes most of it to its children)."""
    order: tuple[str, ...] = ()
    """The dest of each value option's occurrence on the command line, in
    command-line order (--lora and --lora-scaled number adapters across both;
    of --ui-config and --ui-config-file the later wins)."""


class _ArgParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting with 2."""

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")
        spellings, sep, what = message.partition(": ")
        if sep and what.startswith("expected ") and what.endswith(("argument", "arguments")):
            last = spellings.split("/")[-1]
            message = (f"{last} needs a value (a value that starts with '-' "
                       f"is written {last}=VALUE)")
        raise CliError(message)

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        # argparse matches prefixes of single-dash options ("-ng" for "-ngl",
        # "-n5" for "-n 5") even with allow_abbrev off; llama-server accepts
        # exact spellings only, and so do we.
        return []


class _Formatter(argparse.HelpFormatter):
    """Renders "-np, --parallel N" once per option, keeping our line breaks."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        text = ", ".join(action.option_strings)
        return f"{text} {action.metavar}" if action.metavar else text

    def _split_lines(self, text: str, width: int) -> list[str]:
        # textwrap directly: argparse's own wrapper splits "mlx-community".
        lines: list[str] = []
        for paragraph in text.splitlines():
            lines.extend(textwrap.wrap(" ".join(paragraph.split()), width,
                                       break_on_hyphens=False, break_long_words=False))
        return lines


class _SetTrue(argparse.Action):
    """A value-less flag or action; for a bool pair, negations store False."""

    def __init__(self, *args: Any, negations: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, nargs=0, **kwargs)
        self.negations = negations

    def __call__(  # type: ignore[no-untyped-def]
        self, parser, namespace, values, option_string=None
    ) -> None:
        setattr(namespace, self.dest, option_string not in self.negations)


class _Ordered(argparse.Action):
    """Mixed into argparse's own action: it also records which value option
    came when (Parsed.order)."""

    def __call__(  # type: ignore[no-untyped-def]
        self, parser, namespace, values, option_string=None
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        namespace.__dict__.setdefault(ORDER_KEY, []).append(self.dest)


class _Append(_Ordered, argparse._AppendAction):
    """append (a repeatable option), in order."""


class _Store(_Ordered, argparse._StoreAction):
    """store, in order."""


ORDER_KEY = " order"  # not a valid dest, so it never collides with an option


def help_text(opt: Option) -> str:
    """The help column for one option: description, default, env variable;
    a deferred option says what it accepts until it is implemented."""
    text = opt.help
    default = opt.shown_default()
    if default is not None:
        text += f" (default: {default})"
    if opt.status == "deferred":
        accepts = f"accepts only {opt.accepts}" if opt.accepts else "refused if given"
        text += f"\n[not implemented yet: {accepts}]"
    if opt.quiet is not None:  # a tuning option: accepted, as upstream, with no effect
        text += f"\n{NO_EFFECT_MARK}"
    if opt.env:
        text += f"\n(env: {opt.env})"
    return text.replace("%", "%%")


def build_parser(
    table: Sequence[Option] = OPTIONS, prog: str = "mlxcel-server"
) -> argparse.ArgumentParser:
    """An argparse parser for `table`; hidden options parse but do not render."""
    check_table(tuple(table))
    parser = _ArgParser(
        prog=prog,
        usage="%(prog)s [options]",
        description="An LLM inference server for MLX checkpoints, compatible "
        "with llama.cpp's llama-server.",
        epilog="An option naming an (env: ...) variable can also be set there; "
        "the command line wins over the environment.",
        allow_abbrev=False,
        add_help=False,
        formatter_class=lambda prog: _Formatter(
            prog, max_help_position=HELP_COLUMN, width=HELP_WIDTH
        ),
    )
    groups = {key: parser.add_argument_group(title) for key, title in SECTIONS.items()}
    for opt in table:
        group = groups[opt.section]
        shown = argparse.SUPPRESS if opt.hidden else help_text(opt)
        common = dict(dest=opt.dest, default=argparse.SUPPRESS, help=shown)
        if opt.kind == "value":
            nargs = None if opt.nargs == 1 else opt.nargs
            group.add_argument(*opt.spellings, action=_Append if opt.repeat else _Store,
                               metavar=opt.metavar, nargs=nargs, **common)
        else:
            group.add_argument(*opt.all_spellings, action=_SetTrue,
                               negations=opt.negations, **common)
    return parser


def _shown(opt: Option, raw: str) -> str:
    return "<redacted>" if opt.secret else repr(raw)


def _typed(opt: Option, raw: str, source: str | None) -> Any:
    """Parse one raw value (argv or env) through the option's domain."""
    origin = f" (from {source})" if source else ""
    try:
        if opt.kind == "value":
            assert opt.value is not None
            return opt.value.parse(raw)
        return parse_bool(raw)
    except BadValue as exc:
        domain = opt.value.domain if opt.value is not None else BOOL_DOMAIN
        raise CliError(
            f"invalid value {_shown(opt, raw)} for {opt.name}{origin}: {exc}; "
            f"expected {domain}"
        ) from None


def _from_env(opt: Option, env: Mapping[str, str]) -> tuple[str, Any, str] | None:
    """(variable, value, text) from an option's environment binding, or None.

    Upstream's rules: a bool pair's LLAMA_ARG_NO_<NAME> means false whatever
    its value and is looked at first; a value-less flag fires only for a
    truthy spelling and is otherwise simply not given.
    """
    negated = opt.env_negated
    if negated and negated in env:
        return negated, False, env[negated]
    if not opt.env or opt.env not in env:
        return None
    text = env[opt.env]
    if opt.kind == "flag":
        return (opt.env, True, text) if is_truthy(text) else None
    return opt.env, _typed(opt, text, opt.env), text


def parse(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    table: Sequence[Option] = OPTIONS,
    prog: str = "mlxcel-server",
) -> Parsed:
    """Merge argv and the environment into typed values (argv wins); every
    unknown option and bad value is reported in one CliError."""
    parsed = parse_all(argv, env, table, prog)
    if parsed.problems:
        raise CliError(*parsed.problems)
    return parsed


def underscores_as_dashes(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """upstream reads `_` as `-` in a long option's name (--backend_sampling
    is --backend-sampling); a value is never rewritten, nor a name that is
    not an option once rewritten."""
    known = parser._option_string_actions
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if arg.startswith("--") and "_" in name and name not in known:
            dashed = name.replace("_", "-")
            if dashed in known:
                arg = dashed + eq + value
        out.append(arg)
    return out


def parse_all(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    table: Sequence[Option] = OPTIONS,
    prog: str = "mlxcel-server",
) -> Parsed:
    """`parse` that keeps going: the problems travel in `Parsed.problems`
    (an option whose value failed keeps its default), so the startup checks
    can add theirs and one run reports everything."""
    env = os.environ if env is None else env
    parser = build_parser(table, prog)
    argv = underscores_as_dashes(sys.argv[1:] if argv is None else argv, parser)
    namespace, extras = parser.parse_known_args(argv)
    # every unknown option; a value after one is not reported again
    unknown = [e for e in extras if e.startswith("-")] or extras[:1]
    problems = [f"invalid argument: {e} (no such option; see --help)" for e in unknown]
    raw: dict[str, Any] = vars(namespace)
    order = tuple(raw.pop(ORDER_KEY, ()))
    for opt in table:
        if opt.kind == "action" and opt.dest in raw:
            return Parsed(values={}, given={}, action=opt.dest)
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    texts: dict[str, str] = {}
    for opt in table:
        if opt.kind == "action":
            continue
        try:
            _merge_one(opt, raw, env, values, given, texts)
        except CliError as exc:
            problems.extend(exc.lines)
            values[opt.dest] = opt.default
            given.pop(opt.dest, None)
    return Parsed(values=values, given=given, raw=texts, problems=tuple(problems), order=order,
                  argv=tuple(argv))


def _merge_one(opt: Option, raw: Mapping[str, Any], env: Mapping[str, str],
               values: dict[str, Any], given: dict[str, str], texts: dict[str, str]) -> None:
    """One option's typed value: argv first, then its environment binding,
    then the table default."""
    if opt.dest in raw:
        value = raw[opt.dest]
        if opt.kind == "value" and opt.repeat:
            texts[opt.dest] = " ".join(value)
            typed, bad = [], []
            for v in value:  # every bad occurrence, not only the first
                try:
                    typed.append(_typed(opt, v, None))
                except CliError as exc:
                    bad.extend(exc.lines)
            if bad:
                raise CliError(*bad)
            value = tuple(typed)
        elif opt.kind == "value":
            if isinstance(value, list):  # nargs > 1
                value = " ".join(value)
            texts[opt.dest] = value
            value = _typed(opt, value, None)
        values[opt.dest] = value
        given[opt.dest] = "argv"
        return
    bound = _from_env(opt, env)
    if bound is None:
        values[opt.dest] = opt.default
    else:
        given[opt.dest], values[opt.dest], texts[opt.dest] = bound


def describe(opt: Option, parsed: Parsed) -> str:
    """How a diagnostic names what was given: "--threads '8'", "--no-mmap",
    "--perf (from LLAMA_ARG_PERF)"."""
    source = parsed.given.get(opt.dest, "argv")
    origin = "" if source == "argv" else f" (from {source})"
    if opt.kind == "value":
        text = parsed.raw.get(opt.dest, str(parsed.values.get(opt.dest)))
        return f"{opt.name} {_shown(opt, text)}{origin}"
    if opt.kind == "bool" and parsed.values.get(opt.dest) is False:
        return f"{opt.negation_name}{origin}"
    return f"{opt.name}{origin}"


def refusal(opt: Option, parsed: Parsed) -> str | None:
    """The one-line refusal for an explicitly given option, or None."""
    if opt.refuse is None or opt.dest not in parsed.given:
        return None
    if any(dest in parsed.given for dest in opt.superseded_by):
        return None  # e.g. --mlock is not classified when --load-mode is given
    reason = opt.refuse(parsed.values[opt.dest])
    return None if reason is None else f"{describe(opt, parsed)}: {reason}"


def validate(parsed: Parsed, table: Sequence[Option] = OPTIONS) -> None:
    """Run each explicitly given option's refuse hook; every refusal is
    reported, in table order."""
    lines = [line for line in (refusal(opt, parsed) for opt in table) if line is not None]
    if lines:
        raise CliError(*lines)


def without_effect(parsed: Parsed, table: Sequence[Option] = OPTIONS) -> tuple[str, ...]:
    """The tuning options given with a value that asks for something, named
    as the operator gave them, for the startup line "has no effect on MLX"."""
    return tuple(
        describe(opt, parsed) for opt in table
        if opt.quiet is not None and opt.dest in parsed.given
        and not any(dest in parsed.given for dest in opt.superseded_by)
        and not opt.quiet(parsed.values[opt.dest]))
