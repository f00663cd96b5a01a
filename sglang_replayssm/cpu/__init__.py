"""The CPU path of the plug-in (``--device cpu``): pure-torch pieces SGLang lacks on a CPU.

Used only by the ReplaySSM backends and only for CPU tensors; ``--ssm-backend default`` never reaches
it (the model-layer pieces of ``gdn`` are reached through ``hooks/cpu.py``, which is installed
with ``--ssm-backend replay`` only).  ``mamba2_mixer``: a torch ``MambaMixer2.forward`` with ring decode through the kernel reference.
``gdn``: the Qwen3-Next GDN backend path (conv, delta-rule extend, ring decode through the kernel
reference) and the model-layer pieces that ``hooks/cpu.py`` routes to for CPU tensors.
``spec_ops`` and ``verify_attention``: SGLang's speculative-decoding bookkeeping ops and the
``torch_native`` TARGET_VERIFY attention, which ``hooks/cpu_spec.py`` routes CPU calls to.
"""
