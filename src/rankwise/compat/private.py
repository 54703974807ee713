"""Every private attribute of torch, DeepSpeed, Accelerate and Horovod that rankwise reads or calls
outside the workarounds and patches (those keep their records beside them), each a
:class:`~rankwise.compat.versions.Private` saying what rankwise needs and why no public API gives
it.

``tests/compat/test_private_apis.py`` resolves each on the installed releases and scans the code: a
private name of those libraries touched with no record here, in a workaround or in a patch fails
it, and a private module is imported only under ``compat/``.
"""

from __future__ import annotations

from rankwise.compat.versions import Private

TORCH = ("2.11", "2.13")
"""torch release series checked (the CPU machines' 2.13, the GPU pass's 2.11)."""
DEEPSPEED = ("0.19",)
ACCELERATE = ("1.15",)
HOROVOD = ("0.28",)

C10D_WORLD = Private(
    "torch.distributed.distributed_c10d._world",
    "torch",
    "the process groups alive at teardown (pg_map), kept until release_groups() frees them "
    "without the GIL (launch/exits.py); no public API lists them",
    TORCH,
)
DEFAULT_STORE = Private(
    "torch.distributed.distributed_c10d._get_default_store",
    "torch",
    "the job's store, to count a barrier's arrivals outside collectives (comm's barrier demo)",
    TORCH,
)
DDP_LOGGING_DATA = Private(
    "torch.nn.parallel.DistributedDataParallel._get_ddp_logging_data",
    "torch",
    "DDP's bucket sizes after its rebuild, which bench --explain names (best effort)",
    TORCH,
)
BATCH_NORM = Private(
    "torch.nn.modules.batchnorm._BatchNorm",
    "torch",
    "the base of every batch normalisation (1d/2d/3d, lazy): a model whose result depends on the "
    "batch split",
    TORCH,
)
INSTANCE_NORM = Private(
    "torch.nn.modules.instancenorm._InstanceNorm",
    "torch",
    "the base of every instance normalisation, whose running statistics follow the batch",
    TORCH,
)
TENSOR_VERSION = Private(
    "torch.Tensor._version",
    "torch",
    "a tensor's count of in-place writes: whether a batch rt.loader handed out was changed before "
    "rt.to_device, so that the device copy made ahead for it is stale (runtime/prefetch.py); no "
    "public API counts a tensor's writes",
    TORCH,
)
DROPOUT = Private(
    "torch.nn.modules.dropout._DropoutNd",
    "torch",
    "the base of every dropout module (Dropout, Dropout1d/2d/3d, AlphaDropout, ...)",
    TORCH,
)
CONV = Private(
    "torch.nn.modules.conv._ConvNd",
    "torch",
    "the base of every convolution: whether a model's fp32 products run on TF32 (cuDNN's default)",
    TORCH,
)
MODULE_PARAMETERS = Private(
    "torch.nn.Module._parameters",
    "torch",
    "a module's own parameters, to move fake ones in place as torch's _apply moves real ones",
    TORCH,
    on_instance=True,
)
MODULE_BUFFERS = Private(
    "torch.nn.Module._buffers",
    "torch",
    "a module's own buffers, converted beside its fake parameters",
    TORCH,
    on_instance=True,
)
LBFGS_PARAMS = Private(
    "torch.optim.LBFGS._params",
    "torch",
    "LBFGS keeps its one group's parameters in a list of its own, which FSDP's sharded ones "
    "replace",
    TORCH,
    on_instance=True,
)
DYNAMO_RESET = Private(
    "torch._dynamo.reset",
    "torch",
    "forget code Dynamo met under a tracing mode and marked to skip, so the script's compiled "
    "code runs compiled afterwards",
    TORCH,
)
COMPILED_MODULE = Private(
    "torch._dynamo.eval_frame.OptimizedModule._orig_mod",
    "torch",
    "a compiled module's original: whether a model was compiled (FLOPs are not counted inside "
    "compiled graphs)",
    TORCH,
    on_instance=True,
)
COMPILED_CALLABLE = Private(
    "torch._dynamo.eval_frame.OptimizedModule._torchdynamo_orig_callable",
    "torch",
    "set on what torch.compile returns (a module's forward, a function): whether it was compiled",
    TORCH,
    on_instance=True,
)
RAW_FORMULA = Private(
    "torch.utils.flop_counter._get_raw",
    "torch",
    "a formula FlopCounterMode calls with the tensors, not their shapes (custom_mapping), as torch "
    "marks its own",
    TORCH,
    on_instance=True,
)
HP_STATES_LINKED = Private(
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer._hp_optimizer_states_linked",
    "deepspeed",
    "ZeRO-1/2 link each parameter to its optimizer-state slice lazily, once: after a state is put "
    "in place (a whole state loaded), the link is made again",
    DEEPSPEED,
    on_instance=True,
)
LAZY_INIT_HP_STATES = Private(
    "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer._lazy_init_hp_params_optimizer_state",
    "deepspeed",
    "makes that link",
    DEEPSPEED,
)
ENGINE_CONFIG = Private(
    "deepspeed.runtime.engine.DeepSpeedEngine._config",
    "deepspeed",
    "the engine's parsed config (its clipping and ZeRO settings for one step)",
    DEEPSPEED,
    on_instance=True,
)
FP32_PARTITION = Private(
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3._get_fp32_opt_state_partition",
    "deepspeed",
    "a ZeRO-3 sub-group's fp32 partition and its state, to write a whole state into it",
    DEEPSPEED,
)
PARTITION_WORLD_SIZE = Private(
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3._get_param_partition_world_size",
    "deepspeed",
    "the ranks ZeRO-3 partitions a parameter over",
    DEEPSPEED,
)
PARTITION_RANK = Private(
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3._get_param_partition_rank",
    "deepspeed",
    "this rank's place among them",
    DEEPSPEED,
)
ACCELERATE_SHARED_STATE = Private(
    "accelerate.state.PartialState._shared_state",
    "accelerate",
    "the process count Accelerate settled on, without creating its state where the script did not",
    ACCELERATE,
)
ACCELERATOR_RESET = Private(
    "accelerate.state.AcceleratorState._reset_state",
    "accelerate",
    "reset Accelerate's process-wide state between two runs in one process",
    ACCELERATE,
)
GRADIENT_RESET = Private(
    "accelerate.state.GradientState._reset_state",
    "accelerate",
    "the same for its gradient state",
    ACCELERATE,
)
HOROVOD_OPTIMIZER = Private(
    "horovod.torch.optimizer._DistributedOptimizer",
    "horovod",
    "the class hvd.DistributedOptimizer makes (a subclass of the script's optimizer), whose step "
    "the watcher follows",
    HOROVOD,
)
HOROVOD_SHOULD_SYNCHRONIZE = Private(
    "horovod.torch.optimizer._DistributedOptimizer._should_synchronize",
    "horovod",
    "whether its step all-reduces first (false after the script's own synchronize())",
    HOROVOD,
    on_instance=True,
)
HOROVOD_COMPRESSION = Private(
    "horovod.torch.optimizer._DistributedOptimizer._compression",
    "horovod",
    "the gradients' compression (fp16 or none), which the report names the exchange by",
    HOROVOD,
    on_instance=True,
)
DATALOADER_ITER = Private(
    "torch.utils.data.dataloader._BaseDataLoaderIter",
    "torch",
    "the base of a DataLoader's iterators (one process or workers), where each batch's indices "
    "come from (its _next_index is a recorded patch)",
    TORCH,
)
