"""Whether the Hugging Face Hub can be reached, offline mode while it cannot, and Hub kernels off.

Without a network, ``datasets.load_dataset`` retries each request five times with back-off
(1 + 2 + 4 + 8 + 8 s, ``huggingface_hub``'s defaults) before it fails, per file: a benchmark of many
subtasks would wait minutes for an answer that a 3-second probe gives at once. :func:`hub_offline_unless_reachable`
probes the Hub's host once and, when it cannot be reached, turns on the libraries' offline mode
(``HF_HUB_OFFLINE``) for the block: what is in the local cache still loads, what is not fails at
once with ``OfflineModeIsEnabled``.

The flags are module attributes that ``huggingface_hub`` and ``datasets`` read at import time from
the environment and at call time from the module, so they are set on the modules (and put back
after the block), not in ``os.environ``, which would change nothing once they are imported.

**Hub kernels.** transformers (5.x, ``integrations/hub_kernels.py``) kernelizes every model that
``from_pretrained`` loads when the ``kernels`` package is installed, unless ``USE_HUB_KERNELS`` is
false: on a GPU that downloads kernels such as ``kernels-community/rotary`` from the Hub, which
offline is a ``ValueError`` or minutes of DNS retries. The toolkit's loads pass
:func:`hub_kernel_kwargs`, which keeps them off unless the user turns them on.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "HUB_PROBE_TIMEOUT_S",
    "hub_kernel_kwargs",
    "hub_kernels_requested",
    "hub_offline_unless_reachable",
    "hub_reachable",
]

HUB_PROBE_TIMEOUT_S = 3.0  # one TCP connect; a reachable Hub answers in well under a second
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
# transformers' own spelling of a true USE_HUB_KERNELS (utils/import_utils.is_env_variable_true)
_TRUE_VALUES = ("true", "1", "y", "yes", "on")


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to the Hub's endpoint (``HF_ENDPOINT``, default huggingface.co:443)
    opens within ``timeout_s`` seconds, or when a proxy is configured (requests go through it, so a
    direct connection says nothing). Never raises."""
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return True
    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:  # DNS failure, refused, unreachable, timed out
        return False


@contextmanager
def hub_offline_unless_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> Iterator[bool]:
    """Run the block in the Hub libraries' offline mode when the Hub cannot be reached; yields
    whether the block runs offline (already set by the user's ``HF_HUB_OFFLINE``, or turned on here).
    The flags are restored on exit."""
    from huggingface_hub import constants

    modules: list[Any] = [constants]
    try:
        from datasets import config as datasets_config

        modules.append(datasets_config)
    except ImportError:  # datasets is optional here: only huggingface_hub's own downloads then
        pass
    saved = [module.HF_HUB_OFFLINE for module in modules]
    offline = any(saved) or not hub_reachable(timeout_s)
    try:
        if offline:
            for module in modules:
                module.HF_HUB_OFFLINE = True
        yield offline
    finally:
        for module, value in zip(modules, saved):
            module.HF_HUB_OFFLINE = value


def hub_kernels_requested() -> bool:
    """True when the user turned Hub kernels on: ``USE_HUB_KERNELS`` set to a true value (1, true,
    yes, on, y; any case). Unset, or any other value, is off. Reads the environment at each call."""
    return os.environ.get("USE_HUB_KERNELS", "").strip().lower() in _TRUE_VALUES


def hub_kernel_kwargs() -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments of every model load of the toolkit that decide Hub
    kernels: ``{"use_kernels": False}`` (transformers' default would turn them on), or ``{}`` when
    :func:`hub_kernels_requested`, which leaves the choice to transformers (it reads the same variable).

    An explicit user setting is never overridden. With kernels turned on and ``HF_HUB_OFFLINE`` set
    (or inside :func:`hub_offline_unless_reachable`), the ``kernels`` package looks them up in its
    local cache only and never reaches the network; one not cached there fails the load with its message.
    """
    return {} if hub_kernels_requested() else {"use_kernels": False}
