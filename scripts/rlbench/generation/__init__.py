"""Text generation behind one interface: the backends (transformers on CPU/GPU, vLLM on GPU) and the
prefix-cached text generator that multi-step rollouts use (textgen).

Builds on: nothing in the library.
"""
