"""sglang_sim: a stdlib-only stand-in for SGLang's server, installed into lab hosts as ``sglang_sim``.

It accepts SGLang's launch flags and HTTP API, reads the kernel knobs from its environment once at
start, and produces decode throughput whose shape follows split-K wave quantization (see ``model``).
"""

__version__ = "0.5.23+sim"  # the SGLang it stands in for (+sim: a local build label; version checks read 0.5.23)
