"""Constrained decoding: GBNF with llama.cpp's semantics, and JSON schemas,
both lowered to llguidance, which computes each step's allowed-token mask.

    gbnf.py        the GBNF parser (upstream's grammar semantics)
    lark.py        lowering a parsed grammar to llguidance's Lark dialect
    compile.py     grammar / schema -> a reusable llguidance matcher
    constraint.py  one sequence's matcher state and lazy triggers

Nothing here imports MLX or trio.
"""
