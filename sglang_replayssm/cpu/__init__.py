"""The CPU path of the plug-in (``--device cpu``): pure-torch pieces SGLang lacks on a CPU.

Used only by the ReplaySSM backends and only for CPU tensors; ``--ssm-backend default`` never reaches
it.  ``mamba2_mixer``: a torch ``MambaMixer2.forward`` with ring decode through the kernel reference.
"""
