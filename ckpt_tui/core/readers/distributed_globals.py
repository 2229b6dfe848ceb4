"""Exact global names that distributed checkpoints pickle, known here as inert data.

Each name was checked in the framework's source (torch 2.13, DeepSpeed 0.19): constructing it the
way a pickle does (NEWOBJ/REDUCE, then BUILD or ``__setstate__``) only stores fields: it imports no
user code and touches no file. Readers pass these to ``load_pickle(known_classes=...)``; they become
recording stand-ins marked safe, never the real classes. Dotted names (attribute chains) are never
listed: ``ShardedTensor.ProcessGroupState`` is reached only through :func:`nested_class`.
"""

from __future__ import annotations

from typing import Any

from ckpt_tui.core.model.tree import Opaque, opaque_class

DCP_CLASSES = frozenset(
    {
        # torch/distributed/checkpoint/metadata.py: dataclasses and an Enum; TensorProperties.__setstate__
        # only maps the enum back to a memory format
        "torch.distributed.checkpoint.metadata.Metadata",
        "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
        "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
        "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
        "torch.distributed.checkpoint.metadata.TensorProperties",
        "torch.distributed.checkpoint.metadata.MetadataIndex",
        "torch.distributed.checkpoint.metadata.StorageMeta",
        "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
        # torch/distributed/checkpoint/filesystem.py: (relative_path, offset, length, transform_descriptors)
        "torch.distributed.checkpoint.filesystem._StorageInfo",
    }
)

SHARDED_TENSOR_CLASSES = frozenset(
    {
        # torch/distributed/_shard: FSDP1 SHARDED_/LOCAL_STATE_DICT values. ShardedTensor.__setstate__
        # refuses to run without a process group; the others are dataclasses and NamedTuples
        "torch.distributed._shard.sharded_tensor.api.ShardedTensor",
        "torch.distributed._shard.sharded_tensor.shard.Shard",
        "torch.distributed._shard.sharded_tensor.metadata.ShardedTensorMetadata",
        "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
        "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
        "torch.distributed._shard.metadata.ShardMetadata",
        "torch.distributed._shard.sharding_spec.chunk_sharding_spec.ChunkShardingSpec",
        "torch.distributed.remote_device._remote_device",
    }
)

DTENSOR_CLASSES = frozenset(
    {
        # the names torch/distributed/tensor/__init__.py and device_mesh.py give add_safe_globals
        "torch.distributed.tensor.DTensor",
        "torch.distributed.tensor._api.DTensor",
        "torch.distributed.tensor._dtensor_spec.DTensorSpec",
        "torch.distributed.tensor._dtensor_spec.TensorMeta",
        "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
        "torch.distributed.tensor.placement_types.Shard",
        "torch.distributed.tensor.placement_types.Replicate",
        "torch.distributed.tensor.placement_types.Partial",
        "torch.distributed.tensor.placement_types._StridedShard",
        "torch.distributed.device_mesh.DeviceMesh",
        "torch.distributed._mesh_layout._FlatLayout",
        "torch.distributed._mesh_layout._MeshLayout",
    }
)

DEEPSPEED_CLASSES = frozenset(
    {
        # deepspeed 0.19 runtime/zero/config.py: ZeroStageEnum(int, Enum), rebuilt as ZeroStageEnum(2)
        "deepspeed.runtime.zero.config.ZeroStageEnum",
        # utils/tensor_fragment.py: @dataclass fragment_address(numel, start)
        "deepspeed.utils.tensor_fragment.fragment_address",
        # runtime/fp16/loss_scaler.py: plain classes (cur_scale, dynamic, ...); no __setstate__ anywhere up
        # their bases (LossScalerBase, DeepSpeedConfigObject): BUILD only fills __dict__
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    }
)

DISTRIBUTED_CLASSES = DCP_CLASSES | SHARDED_TENSOR_CLASSES | DTENSOR_CLASSES | DEEPSPEED_CLASSES

PROCESS_GROUP_STATE = "torch.distributed._shard.sharded_tensor.api.ShardedTensor.ProcessGroupState"
SHARDED_TENSOR = "torch.distributed._shard.sharded_tensor.api.ShardedTensor"
_PROCESS_GROUP_STATE = opaque_class(PROCESS_GROUP_STATE, safe=True)
_GETATTR = opaque_class("builtins.getattr")


def nested_class(owner: Any, name: Any) -> Any:
    """``builtins.getattr`` as ShardedTensor pickles use it: only ``ShardedTensor.ProcessGroupState``.

    Any other use is recorded as an unsafe ``builtins.getattr`` call (reported, never run): the real
    unpickler would resolve it to whatever object it names.
    """
    known = isinstance(owner, type) and issubclass(owner, Opaque) and owner.global_name == SHARDED_TENSOR
    if known and name == "ProcessGroupState":
        return _PROCESS_GROUP_STATE
    return _GETATTR(owner, name)


DISTRIBUTED_GLOBALS: dict[str, Any] = {"builtins.getattr": nested_class}


def framework_of(global_name: str) -> str | None:
    """The framework whose own class a known distributed global is ("DeepSpeed", "torch.distributed"), else None."""
    if global_name in DEEPSPEED_CLASSES:
        return "DeepSpeed"
    if global_name in DISTRIBUTED_CLASSES or global_name == PROCESS_GROUP_STATE:
        return "torch.distributed"
    return None
