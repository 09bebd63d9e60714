"""Whether this build has the door for CUDA tensors, found without loading it (nor CUDA)."""

from importlib.util import find_spec

has_cuda: bool = find_spec("flashcache._cuda") is not None
