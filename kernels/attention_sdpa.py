"""Attention's SDPA providers, one per backend of F.scaled_dot_product_attention
(`sdpa-flash`, `sdpa-cudnn`, `sdpa-efficient`, `sdpa-math`): the torch provider's call
with only that backend allowed (torch.nn.attention.sdpa_kernel).  A backend that refuses
a case (its dtype, head dim, device) makes torch raise; the row is then skipped with the
reasons torch warned about, which name what the backend lacks."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.spec import Inputs, Provider, ProviderFn, SkipFn, Target, UnsupportedShape

# provider name -> SDPBackend member
SDPA_PROVIDERS: dict[str, str] = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-math": "MATH",
}


def only_backend(fn: ProviderFn, backend: str) -> ProviderFn:
    """`fn` with SDPA restricted to `backend`; UnsupportedShape with torch's reasons when
    the backend refuses the case."""
    member = getattr(SDPBackend, backend)

    def run(inputs: Inputs, out: torch.Tensor) -> object:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([member]):
                    return fn(inputs, out)
            except RuntimeError as e:
                if "no available kernel" not in str(e).lower() \
                        and "no viable backend" not in str(e).lower():
                    raise
                # torch warns why each backend declined (head dim, dtype, alignment);
                # where it warns nothing (a CPU, which has no such kernel) its error
                # says only that no backend was left.
                why = "; ".join(dict.fromkeys(" ".join(str(w.message).split()) for w in said))
                if why:
                    raise UnsupportedShape(f"SDPA's {backend} backend refused this case: "
                                           f"{why}") from None
                device = inputs["q"].device.type
                raise UnsupportedShape(
                    f"SDPA's {backend} backend has no {device.upper()} kernel (torch: "
                    f"{' '.join(str(e).split()[:10])} ...)" if device == "cpu" else
                    f"SDPA's {backend} backend refused this case: "
                    f"{' '.join(str(e).split())}") from None
    return run


def _cpu_skip(name: str, target: Target) -> str | None:
    if target.kind == "cuda":
        return None
    if name == "sdpa-flash":
        # torch runs FLASH_ATTENTION on a CPU with a CPU port of its own, which is what
        # the torch provider's row names ("flash (CPU kernel)"); the FlashAttention
        # library this provider stands for is CUDA-only.
        return ("sdpa-flash is FlashAttention's CUDA kernel; on a CPU SDPA's "
                "FLASH_ATTENTION backend is a CPU port (the torch row runs it)")
    return None


def sdpa_providers(fn: ProviderFn, dtypes: tuple[str, ...], skip: SkipFn | None,
                   backend: Callable[[Callable[[], object]], str] | None
                   ) -> dict[str, Provider]:
    """The four SDPA providers of an attention family whose torch provider is `fn`."""
    out: dict[str, Provider] = {}
    for name, member in SDPA_PROVIDERS.items():
        def skip_of(dtype: str, target: Target, name: str = name) -> str | None:
            return _cpu_skip(name, target) or (skip(dtype, target) if skip else None)
        out[name] = Provider(name, only_backend(fn, member), dtypes, skip=skip_of,
                             note=f"F.scaled_dot_product_attention, {member} backend only "
                                  "(torch.nn.attention.sdpa_kernel)", backend=backend)
    return out
