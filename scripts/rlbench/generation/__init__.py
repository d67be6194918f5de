"""Text generation behind one interface: the backends (transformers on CPU/GPU, vLLM on GPU) and the
text generators that multi-step rollouts use (textgen chooses one; the prefix-cached one is prefix_cache).

Builds on: nothing in the library.
"""
