"""The batch envelope between rollout, reward, algorithm and trainer (after verl's DataProto).

    Batch(tensors={"input_ids": (N, T), ...}, objects={"trajectory": [N objects], ...}, meta={...})

Every tensor and object list shares the sample dimension N, which every operation checks. `meta`
holds batch-level values (step, metrics); `concat` merges metric dicts instead of overwriting them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    objects: dict[str, list[Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check()

    def __len__(self) -> int:
        for tensor in self.tensors.values():
            return len(tensor)
        for objects in self.objects.values():
            return len(objects)
        return 0

    def check(self) -> None:
        """Every field has the same number of samples."""
        sizes = {name: len(t) for name, t in self.tensors.items()} | {name: len(o) for name, o in self.objects.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch fields disagree on the number of samples: {sizes}")

    def union(self, other: Batch) -> Batch:
        """Fields of both; a name in both must hold the same values."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"union of batches of {len(self)} and {len(other)} samples")
        for name in self.tensors.keys() & other.tensors.keys():
            if not torch.equal(self.tensors[name], other.tensors[name]):
                raise ValueError(f"union: tensor {name!r} differs between the batches")
        for name in self.objects.keys() & other.objects.keys():
            if list(self.objects[name]) != list(other.objects[name]):
                raise ValueError(f"union: objects {name!r} differ between the batches")
        return Batch({**self.tensors, **other.tensors}, {**self.objects, **other.objects}, {**self.meta, **other.meta})

    def index(self, indices: list[int] | torch.Tensor) -> Batch:
        """Samples at `indices`, in that order (repeats allowed)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        order = idx.tolist()
        return Batch(
            {k: v[idx] for k, v in self.tensors.items()},
            {k: [v[i] for i in order] for k, v in self.objects.items()},
            dict(self.meta),
        )

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        """Samples of all batches in order. Tensors are right-padded to a common length where they differ
        in their second dimension; `meta["metrics"]` dicts are merged into lists, other meta from the first."""
        if not batches:
            raise ValueError("concat of no batches")
        names = batches[0].tensors.keys()
        if any(b.tensors.keys() != names or b.objects.keys() != batches[0].objects.keys() for b in batches):
            raise ValueError("concat needs batches with the same fields")
        tensors = {name: _cat_padded([b.tensors[name] for b in batches]) for name in names}
        objects = {name: [o for b in batches for o in b.objects[name]] for name in batches[0].objects}
        meta = dict(batches[0].meta)
        merged: dict[str, list[Any]] = {}
        for b in batches:
            for key, value in b.meta.get("metrics", {}).items():
                merged.setdefault(key, []).extend(value if isinstance(value, list) else [value])
        if merged:
            meta["metrics"] = merged
        return Batch(tensors, objects, meta)


def _cat_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    if parts[0].dim() < 2 or len({p.shape[1] for p in parts}) == 1:
        return torch.cat(parts)
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) if p.dim() == 2 else p for p in parts])
