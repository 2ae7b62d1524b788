"""Media towers: one file per image or audio family behind one interface.

base.py: the `Tower` interface (load, encode, prefill, span checks) and the
plumbing towers share; registry.py: one row per family, keyed by config.json;
vlm_config.py: an integrated VLM's config (family, text config).  The
families: llava.py, pixtral.py (Pixtral, Mistral 3), gemma3n_audio.py.
"""
