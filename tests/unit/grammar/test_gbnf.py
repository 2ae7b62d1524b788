"""GBNF conformance: each of llama.cpp's grammar rules, accept and reject
cases, through the whole path (parse -> lowering -> llguidance matcher)."""

from __future__ import annotations

import pytest

from mlxcel_trio.grammar.compile import GrammarError, GrammarSpec, MAX_GBNF_BYTES
from mlxcel_trio.grammar.gbnf import GbnfError, parse

THINK = 1539  # <think> in the tiny fixture's vocabulary


def fails(src: str) -> str:
    with pytest.raises(GbnfError) as exc:
        parse(src, lambda t: [THINK] if t == "<think>" else [1, 2])
    return str(exc.value)


# -- syntax --------------------------------------------------------------------------

def test_identifiers_take_letters_digits_and_dashes_not_underscores(accepts):
    assert accepts('root ::= my-rule 2nd\nmy-rule ::= "a"\n2nd ::= "b"', "ab")
    assert fails('root ::= my_rule\nmy_rule ::= "a"').startswith(
        "expecting newline or end at _rule")


def test_comments_run_to_the_end_of_the_line_and_count_as_space(accepts):
    src = '# header\nroot ::= "a" | # trailing\n  # indented\n  "b" # alt\n'
    assert accepts(src, "a") and accepts(src, "b")
    # a bar that starts a line is not a continuation: a newline ended the rule
    assert fails('root ::= "a"\n | "b"').startswith('expecting name at | "b"')
    assert accepts('root ::= "#x" # not a comment inside quotes', "#x")


def test_an_empty_alternative_is_legal_and_matches_nothing(accepts):
    src = 'root ::= "x" opt "y"\nopt ::= "a" | '
    assert accepts(src, "xy") and accepts(src, "xay") and not accepts(src, "xby")
    assert accepts('root ::= | "a"', "")


def test_a_newline_ends_a_rule_except_in_parentheses_or_after_a_bar(accepts):
    assert fails('root ::= "a"\n  "b"').startswith('expecting name at "b"')
    assert accepts('root ::= ("a"\n  "b")', "ab")
    assert accepts('root ::= "a" |\n  "b"', "b")
    assert accepts('root ::= "a"\r\nx ::= "b"\r\n', "a")


def test_escapes(accepts):
    assert accepts(r'root ::= "\x41\u00e9\U0001F600\t\"\\\[\]"', 'Aé😀\t"\\[]')
    assert fails(r'root ::= "\q"').startswith("unknown escape at")
    assert fails(r'root ::= "\x4"').startswith("expecting 2 hex chars at")


def test_character_classes(accepts):
    src = 'root ::= [a-cx] [^a-z] [-a] [a-]'
    assert accepts(src, "bZ--") and accepts(src, "x9aa") and not accepts(src, "dZ--")
    assert not accepts(src, "bz--")


def test_dot_matches_any_code_point_including_a_newline(accepts):
    assert accepts('root ::= . . "x"', "\néx")
    assert not accepts('root ::= . "x"', "x")


def test_undefined_and_missing_rules():
    assert fails('root ::= foo') == "Undefined rule identifier 'foo'"
    assert fails('root ::= foo bar\nbar ::= "x"') == "Undefined rule identifier 'foo'"
    assert fails('start ::= "x"') == "grammar does not contain a 'root' symbol"
    assert fails('') == "failed to parse grammar"
    assert fails('root ::= ("a"').startswith("expecting ')' at")


def test_a_later_definition_replaces_an_earlier_one(accepts):
    src = 'root ::= "a"\nroot ::= "b"'
    assert accepts(src, "b") and not accepts(src, "a")


# -- repetition ------------------------------------------------------------------------

def test_operators(accepts):
    assert accepts('root ::= "a"* "b"+ "c"?', "bb") and accepts('root ::= "a"* "b"+ "c"?', "aabc")
    assert not accepts('root ::= "a"* "b"+ "c"?', "ac")
    src = 'root ::= "a"{2} "b"{1,3} "c"{2,}'
    assert accepts(src, "aabcc") and accepts(src, "aabbbccccc")
    assert not accepts(src, "abcc") and not accepts(src, "aabbbbcc") and not accepts(src, "aabc")


def test_a_literal_repeats_as_a_whole(accepts):
    assert accepts('root ::= "ab"+', "ababab") and not accepts('root ::= "ab"+', "abb")


def test_x0_erases_the_item(accepts):
    src = 'root ::= "a" "b"{0} "c"'
    assert accepts(src, "ac") and not accepts(src, "abc")
    assert accepts('root ::= "a" "b"{0,0} "c"', "ac")
    # nothing is left for a following operator to apply to
    assert fails('root ::= "a"{0}*').startswith("expecting preceding item to */+/?/{ at")
    assert fails('root ::= *').startswith("expecting preceding item")


def test_repetition_operators_chain(accepts):
    src = 'root ::= "ab"{2}{3}'
    assert accepts(src, "ab" * 6) and not accepts(src, "ab" * 5) and not accepts(src, "ab" * 2)
    src = 'root ::= "a"{1,2}{2}'
    assert all(accepts(src, "a" * n) for n in (2, 3, 4)) and not accepts(src, "a" * 5)


def test_an_oversized_maximum_becomes_unbounded(accepts):
    assert accepts('root ::= "a"{0,5000}', "a" * 2500)
    assert not accepts('root ::= "a"{0,1999}', "a" * 2000)
    assert accepts('root ::= "a"{0,1999}', "a" * 1999)


def test_long_repetitions_stay_matchable(accepts):
    """x* is right-recursive upstream; lowered as a repetition it matches
    any length, where a recursive chain would hit llguidance's row limit."""
    assert accepts('root ::= "\\"" [^"]* "\\""', '"' + "word " * 1500 + '"')
    assert accepts('root ::= ("ab" | "c")+ "!"', "abc" * 1500 + "!")


def test_an_oversized_minimum_is_an_error():
    assert fails('root ::= "a"{2001}').startswith("number of repetitions exceeds sane defaults")
    assert parse('root ::= "a"{1999}')


def test_the_repetition_budget_is_multiplicative():
    assert parse('root ::= "a"{40}{49}')
    assert fails('root ::= "a"{40}{50}').startswith("number of rules that are going to be")
    # a group weighs the symbols created while parsing it
    assert parse('root ::= ("a"{0,30}){60}')
    assert fails('root ::= ("a"{0,30}){70}').startswith("number of rules")
    # a name first seen inside a group counts too
    assert parse('root ::= (x "a"){999}\nx ::= "b"')
    assert fails('root ::= (x "a"){1000}\nx ::= "b"').startswith("number of rules")


def test_generated_rules_are_named_like_upstream():
    g = parse('root ::= ("a" | "b")+ x?\nx ::= "c"')
    assert g.names == ("root", "root_1", "root_2", "x", "root_4")


# -- left recursion ------------------------------------------------------------------------

@pytest.mark.parametrize("src", [
    'root ::= root "a" | "b"',
    'root ::= a\na ::= b "x"\nb ::= a "y" | "z"',
    'root ::= "a"\nunused ::= unused "b"',                   # unreachable, still rejected
    'root ::= opt root "x" | "y"\nopt ::= "a" | ',          # through a rule that may be empty
    'root ::= ("a" | ) root',                               # through a group that may be empty
])
def test_left_recursion_is_rejected_across_every_rule(src):
    assert "left recursion detected for nonterminal at index" in fails(src)


def test_right_recursion_is_fine(accepts):
    assert accepts('root ::= "a" root | "b"', "aaab")


# -- tokens -----------------------------------------------------------------------------------

def test_token_terminals(accepts):
    assert accepts(f'root ::= <[{THINK}]> "x"', tokens=[THINK] + [87])
    assert accepts('root ::= <think> "x"', "<think>x")
    assert not accepts('root ::= <think> "x"', "<thinkx")       # the text is not the token
    assert accepts(f'root ::= !<[{THINK}]> "x"', tokens=[64, 87])
    assert not accepts(f'root ::= !<[{THINK}]> "x"', tokens=[THINK, 87])
    assert not accepts('root ::= !<think> "x"', tokens=[THINK, 87])
    assert "invalid token '<not a token>'" in fails('root ::= <not a token>')


# -- limits ------------------------------------------------------------------------------------

def test_the_source_is_capped_at_256_kib(compiler):
    big = "root ::= " + " | ".join(f'"{i}"' for i in range(60000))
    assert len(big) > MAX_GBNF_BYTES
    with pytest.raises(GrammarError, match="262144 bytes"):
        compiler.compile(GrammarSpec("gbnf", big))


def test_parse_errors_say_failed_to_parse_grammar(compiler):
    with pytest.raises(GrammarError, match="^failed to parse grammar: Undefined rule"):
        compiler.compile(GrammarSpec("gbnf", "root ::= nope"))


def test_greedy_lexing_cannot_lose_a_gbnf_parse(accepts):
    """("a" | "ab") "bc" accepts "abc" in GBNF; so must the lowered grammar."""
    assert accepts('root ::= ("a" | "ab") "bc"', "abc")
    assert accepts('root ::= [a-z]* "x"', "abx")
