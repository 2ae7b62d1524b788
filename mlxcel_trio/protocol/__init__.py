"""The records that cross the seam between the server and the engine.

Like h11's events, these are the protocol both sides speak and neither owns:
jobs and commands go into the engine, events come out (`records.py`), and the
sampler vocabulary is shared by the command line, the request fields and the
engine (`sampler_names.py`).  This package imports neither side, nor trio,
nor MLX, so the command line may load it before anything heavy.
"""
