"""Pinned SGLang target fingerprints, one ``sglang-<version>.json`` per supported release.

Installed as the data package ``sglang_replayssm._targets`` (see ``pyproject.toml``) so that
``sglang_replayssm.patching`` finds the files in any install; nothing here runs.
"""
