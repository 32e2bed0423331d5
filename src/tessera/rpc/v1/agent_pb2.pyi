from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Device(_message.Message):
    __slots__ = ("id", "kind", "name", "capacity_bytes", "free_bytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    name: str
    capacity_bytes: int
    free_bytes: int
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ...) -> None: ...

class ReplicaKV(_message.Message):
    __slots__ = ("replica_id", "pages_total", "pages_used", "running", "waiting", "preemptions", "prefix_hit_tokens", "cached_pages", "max_num_seqs", "sleeping")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAGES_USED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    pages_total: int
    pages_used: int
    running: int
    waiting: int
    preemptions: int
    prefix_hit_tokens: int
    cached_pages: int
    max_num_seqs: int
    sleeping: bool
    def __init__(self, replica_id: _Optional[str] = ..., pages_total: _Optional[int] = ..., pages_used: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., preemptions: _Optional[int] = ..., prefix_hit_tokens: _Optional[int] = ..., cached_pages: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., sleeping: _Optional[bool] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeReply(_message.Message):
    __slots__ = ("agent_id", "devices", "nvml_status", "blocks", "kv", "version", "store_address", "zoo", "scaling_runs", "scaling_hosted", "scaling_pending", "host_cache")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NVML_STATUS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ZOO_FIELD_NUMBER: _ClassVar[int]
    SCALING_RUNS_FIELD_NUMBER: _ClassVar[int]
    SCALING_HOSTED_FIELD_NUMBER: _ClassVar[int]
    SCALING_PENDING_FIELD_NUMBER: _ClassVar[int]
    HOST_CACHE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    nvml_status: str
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    kv: _containers.RepeatedCompositeFieldContainer[ReplicaKV]
    version: str
    store_address: str
    zoo: VariantZoo
    scaling_runs: _containers.RepeatedCompositeFieldContainer[ScalingRunInfo]
    scaling_hosted: _containers.RepeatedCompositeFieldContainer[ScalingHostedRun]
    scaling_pending: _containers.RepeatedCompositeFieldContainer[ScalingPending]
    host_cache: HostCache
    def __init__(self, agent_id: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., nvml_status: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., kv: _Optional[_Iterable[_Union[ReplicaKV, _Mapping]]] = ..., version: _Optional[str] = ..., store_address: _Optional[str] = ..., zoo: _Optional[_Union[VariantZoo, _Mapping]] = ..., scaling_runs: _Optional[_Iterable[_Union[ScalingRunInfo, _Mapping]]] = ..., scaling_hosted: _Optional[_Iterable[_Union[ScalingHostedRun, _Mapping]]] = ..., scaling_pending: _Optional[_Iterable[_Union[ScalingPending, _Mapping]]] = ..., host_cache: _Optional[_Union[HostCache, _Mapping]] = ...) -> None: ...

class HostCache(_message.Message):
    __slots__ = ("budget_bytes", "used_bytes", "pieces", "hits", "misses", "hit_bytes", "evicted")
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    HIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    budget_bytes: int
    used_bytes: int
    pieces: _containers.RepeatedCompositeFieldContainer[HostCachedPiece]
    hits: int
    misses: int
    hit_bytes: int
    evicted: int
    def __init__(self, budget_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., pieces: _Optional[_Iterable[_Union[HostCachedPiece, _Mapping]]] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., hit_bytes: _Optional[int] = ..., evicted: _Optional[int] = ...) -> None: ...

class HostCachedPiece(_message.Message):
    __slots__ = ("model_path", "piece", "dtype", "digest", "nbytes")
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    model_path: str
    piece: str
    dtype: str
    digest: str
    nbytes: int
    def __init__(self, model_path: _Optional[str] = ..., piece: _Optional[str] = ..., dtype: _Optional[str] = ..., digest: _Optional[str] = ..., nbytes: _Optional[int] = ...) -> None: ...

class BlockLoadSource(_message.Message):
    __slots__ = ("peer_bytes", "host_bytes", "storage_bytes", "seconds")
    PEER_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    peer_bytes: int
    host_bytes: int
    storage_bytes: int
    seconds: float
    def __init__(self, peer_bytes: _Optional[int] = ..., host_bytes: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class ProbeLinksRequest(_message.Message):
    __slots__ = ("peers", "nbytes", "model_path")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedScalarFieldContainer[str]
    nbytes: int
    model_path: str
    def __init__(self, peers: _Optional[_Iterable[str]] = ..., nbytes: _Optional[int] = ..., model_path: _Optional[str] = ...) -> None: ...

class ProbeLinksReply(_message.Message):
    __slots__ = ("peers", "storage_bytes_per_s", "storage_error")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    STORAGE_ERROR_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[LinkRate]
    storage_bytes_per_s: float
    storage_error: str
    def __init__(self, peers: _Optional[_Iterable[_Union[LinkRate, _Mapping]]] = ..., storage_bytes_per_s: _Optional[float] = ..., storage_error: _Optional[str] = ...) -> None: ...

class LinkRate(_message.Message):
    __slots__ = ("address", "bytes_per_s", "error")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    address: str
    bytes_per_s: float
    error: str
    def __init__(self, address: _Optional[str] = ..., bytes_per_s: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class ProbeSendRequest(_message.Message):
    __slots__ = ("nbytes", "chunk_bytes")
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    nbytes: int
    chunk_bytes: int
    def __init__(self, nbytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class LoadBlockRequest(_message.Message):
    __slots__ = ("model_path", "layer_start", "layer_end", "device", "replica_id", "stage_index", "num_stages", "next_stage_address", "dtype", "kv_bytes", "page_size", "max_num_seqs", "max_batched_tokens", "source", "generation", "tp_size", "tp_rank", "data_plane", "switch_sources", "share", "stitch", "speculate")
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_STAGE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    SWITCH_SOURCES_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    STITCH_FIELD_NUMBER: _ClassVar[int]
    SPECULATE_FIELD_NUMBER: _ClassVar[int]
    model_path: str
    layer_start: int
    layer_end: int
    device: str
    replica_id: str
    stage_index: int
    num_stages: int
    next_stage_address: str
    dtype: str
    kv_bytes: int
    page_size: int
    max_num_seqs: int
    max_batched_tokens: int
    source: BlockSource
    generation: int
    tp_size: int
    tp_rank: int
    data_plane: DataPlane
    switch_sources: _containers.RepeatedCompositeFieldContainer[SwitchSource]
    share: VariantShare
    stitch: BlockStitch
    speculate: BlockSpeculate
    def __init__(self, model_path: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., device: _Optional[str] = ..., replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., num_stages: _Optional[int] = ..., next_stage_address: _Optional[str] = ..., dtype: _Optional[str] = ..., kv_bytes: _Optional[int] = ..., page_size: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., max_batched_tokens: _Optional[int] = ..., source: _Optional[_Union[BlockSource, _Mapping]] = ..., generation: _Optional[int] = ..., tp_size: _Optional[int] = ..., tp_rank: _Optional[int] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ..., switch_sources: _Optional[_Iterable[_Union[SwitchSource, _Mapping]]] = ..., share: _Optional[_Union[VariantShare, _Mapping]] = ..., stitch: _Optional[_Union[BlockStitch, _Mapping]] = ..., speculate: _Optional[_Union[BlockSpeculate, _Mapping]] = ...) -> None: ...

class SwitchSource(_message.Message):
    __slots__ = ("source", "unit_start", "unit_end")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    UNIT_START_FIELD_NUMBER: _ClassVar[int]
    UNIT_END_FIELD_NUMBER: _ClassVar[int]
    source: BlockSource
    unit_start: int
    unit_end: int
    def __init__(self, source: _Optional[_Union[BlockSource, _Mapping]] = ..., unit_start: _Optional[int] = ..., unit_end: _Optional[int] = ...) -> None: ...

class DataPlane(_message.Message):
    __slots__ = ("store_address", "group", "backend", "timeout_s")
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    store_address: str
    group: str
    backend: str
    timeout_s: float
    def __init__(self, store_address: _Optional[str] = ..., group: _Optional[str] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class BlockSource(_message.Message):
    __slots__ = ("address", "replica_id", "stage_index", "transport")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    address: str
    replica_id: str
    stage_index: int
    transport: str
    def __init__(self, address: _Optional[str] = ..., replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., transport: _Optional[str] = ...) -> None: ...

class PushTensorsRequest(_message.Message):
    __slots__ = ("replica_id", "stage_index", "names", "data_plane")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    names: _containers.RepeatedScalarFieldContainer[str]
    data_plane: DataPlane
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., names: _Optional[_Iterable[str]] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ...) -> None: ...

class PushTensorsReply(_message.Message):
    __slots__ = ("bytes",)
    BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    def __init__(self, bytes: _Optional[int] = ...) -> None: ...

class BlockInfo(_message.Message):
    __slots__ = ("replica_id", "stage_index", "num_stages", "model_path", "layer_start", "layer_end", "device", "param_bytes", "kv_bytes", "kv_pages", "page_size", "dtype", "num_tensors", "next_stage_address", "generation", "tp_size", "tp_rank", "transport", "group_state", "group_reason", "activations", "compile", "variants", "shared_param_bytes", "share", "equivalence", "stitch", "speculate", "results", "load", "piece_digests")
    class PieceDigestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    NEXT_STAGE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    GROUP_STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_REASON_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    SHARED_PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    EQUIVALENCE_FIELD_NUMBER: _ClassVar[int]
    STITCH_FIELD_NUMBER: _ClassVar[int]
    SPECULATE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    PIECE_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    num_stages: int
    model_path: str
    layer_start: int
    layer_end: int
    device: str
    param_bytes: int
    kv_bytes: int
    kv_pages: int
    page_size: int
    dtype: str
    num_tensors: int
    next_stage_address: str
    generation: int
    tp_size: int
    tp_rank: int
    transport: str
    group_state: str
    group_reason: str
    activations: str
    compile: str
    variants: _containers.RepeatedScalarFieldContainer[str]
    shared_param_bytes: int
    share: VariantShare
    equivalence: VariantEquivalence
    stitch: BlockStitch
    speculate: BlockSpeculate
    results: str
    load: BlockLoadSource
    piece_digests: _containers.ScalarMap[str, str]
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., num_stages: _Optional[int] = ..., model_path: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., device: _Optional[str] = ..., param_bytes: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., kv_pages: _Optional[int] = ..., page_size: _Optional[int] = ..., dtype: _Optional[str] = ..., num_tensors: _Optional[int] = ..., next_stage_address: _Optional[str] = ..., generation: _Optional[int] = ..., tp_size: _Optional[int] = ..., tp_rank: _Optional[int] = ..., transport: _Optional[str] = ..., group_state: _Optional[str] = ..., group_reason: _Optional[str] = ..., activations: _Optional[str] = ..., compile: _Optional[str] = ..., variants: _Optional[_Iterable[str]] = ..., shared_param_bytes: _Optional[int] = ..., share: _Optional[_Union[VariantShare, _Mapping]] = ..., equivalence: _Optional[_Union[VariantEquivalence, _Mapping]] = ..., stitch: _Optional[_Union[BlockStitch, _Mapping]] = ..., speculate: _Optional[_Union[BlockSpeculate, _Mapping]] = ..., results: _Optional[str] = ..., load: _Optional[_Union[BlockLoadSource, _Mapping]] = ..., piece_digests: _Optional[_Mapping[str, str]] = ...) -> None: ...

class LoadBlockReply(_message.Message):
    __slots__ = ("block", "already_loaded")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    ALREADY_LOADED_FIELD_NUMBER: _ClassVar[int]
    block: BlockInfo
    already_loaded: bool
    def __init__(self, block: _Optional[_Union[BlockInfo, _Mapping]] = ..., already_loaded: _Optional[bool] = ...) -> None: ...

class UnloadBlockRequest(_message.Message):
    __slots__ = ("replica_id", "stage_index", "tp_rank")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    tp_rank: int
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., tp_rank: _Optional[int] = ...) -> None: ...

class UnloadBlockReply(_message.Message):
    __slots__ = ("unloaded",)
    UNLOADED_FIELD_NUMBER: _ClassVar[int]
    unloaded: bool
    def __init__(self, unloaded: _Optional[bool] = ...) -> None: ...

class ListBlocksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBlocksReply(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_k", "top_p", "has_seed", "seed", "stop_token_ids", "ignore_eos", "has_logprobs", "logprobs")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    HAS_SEED_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    HAS_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    has_seed: bool
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    has_logprobs: bool
    logprobs: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., has_seed: _Optional[bool] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., has_logprobs: _Optional[bool] = ..., logprobs: _Optional[int] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class SeqChunk(_message.Message):
    __slots__ = ("seq_id", "start", "num_tokens", "block_table", "sample", "params", "variant")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TABLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    start: int
    num_tokens: int
    block_table: _containers.RepeatedScalarFieldContainer[int]
    sample: bool
    params: SamplingParams
    variant: str
    def __init__(self, seq_id: _Optional[str] = ..., start: _Optional[int] = ..., num_tokens: _Optional[int] = ..., block_table: _Optional[_Iterable[int]] = ..., sample: _Optional[bool] = ..., params: _Optional[_Union[SamplingParams, _Mapping]] = ..., variant: _Optional[str] = ...) -> None: ...

class StageHello(_message.Message):
    __slots__ = ("replica_id", "stage_index", "layer_start", "model_path")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    layer_start: int
    model_path: str
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., layer_start: _Optional[int] = ..., model_path: _Optional[str] = ...) -> None: ...

class StageStep(_message.Message):
    __slots__ = ("step_id", "chunks", "hidden", "finished", "hidden_on_link", "hidden_dtype", "result_on_link", "trace_parents")
    class TraceParentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_ON_LINK_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_DTYPE_FIELD_NUMBER: _ClassVar[int]
    RESULT_ON_LINK_FIELD_NUMBER: _ClassVar[int]
    TRACE_PARENTS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    chunks: _containers.RepeatedCompositeFieldContainer[SeqChunk]
    hidden: Tensor
    finished: _containers.RepeatedScalarFieldContainer[str]
    hidden_on_link: bool
    hidden_dtype: str
    result_on_link: bool
    trace_parents: _containers.ScalarMap[str, str]
    def __init__(self, step_id: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[SeqChunk, _Mapping]]] = ..., hidden: _Optional[_Union[Tensor, _Mapping]] = ..., finished: _Optional[_Iterable[str]] = ..., hidden_on_link: _Optional[bool] = ..., hidden_dtype: _Optional[str] = ..., result_on_link: _Optional[bool] = ..., trace_parents: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StageMessage(_message.Message):
    __slots__ = ("hello", "step")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    hello: StageHello
    step: StageStep
    def __init__(self, hello: _Optional[_Union[StageHello, _Mapping]] = ..., step: _Optional[_Union[StageStep, _Mapping]] = ...) -> None: ...

class StageHelloReply(_message.Message):
    __slots__ = ("num_pages", "page_size")
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    num_pages: int
    page_size: int
    def __init__(self, num_pages: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("seq_id", "token_id", "logprobs")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    token_id: int
    logprobs: TokenLogprobs
    def __init__(self, seq_id: _Optional[str] = ..., token_id: _Optional[int] = ..., logprobs: _Optional[_Union[TokenLogprobs, _Mapping]] = ...) -> None: ...

class StageStepResult(_message.Message):
    __slots__ = ("step_id", "tokens", "tokens_on_link")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_ON_LINK_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    tokens: _containers.RepeatedCompositeFieldContainer[SampledToken]
    tokens_on_link: bool
    def __init__(self, step_id: _Optional[int] = ..., tokens: _Optional[_Iterable[_Union[SampledToken, _Mapping]]] = ..., tokens_on_link: _Optional[bool] = ...) -> None: ...

class StageResult(_message.Message):
    __slots__ = ("hello", "step")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    hello: StageHelloReply
    step: StageStepResult
    def __init__(self, hello: _Optional[_Union[StageHelloReply, _Mapping]] = ..., step: _Optional[_Union[StageStepResult, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("replica_id", "request_id", "prompt_token_ids", "params", "variant", "trace_parent")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    TRACE_PARENT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    params: SamplingParams
    variant: str
    trace_parent: str
    def __init__(self, replica_id: _Optional[str] = ..., request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., params: _Optional[_Union[SamplingParams, _Mapping]] = ..., variant: _Optional[str] = ..., trace_parent: _Optional[str] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("token_ids", "finish_reason", "prompt_tokens", "completion_tokens", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("replica_id", "request_id")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    request_id: str
    def __init__(self, replica_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CancelReply(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class GenerateMuxRequest(_message.Message):
    __slots__ = ("start", "cancel")
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    start: GenerateRequest
    cancel: GenerateMuxCancel
    def __init__(self, start: _Optional[_Union[GenerateRequest, _Mapping]] = ..., cancel: _Optional[_Union[GenerateMuxCancel, _Mapping]] = ...) -> None: ...

class GenerateMuxCancel(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class GenerateMuxReply(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[GenerateMuxEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[GenerateMuxEntry, _Mapping]]] = ...) -> None: ...

class GenerateMuxEntry(_message.Message):
    __slots__ = ("request_id", "chunk", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    chunk: GenerateChunk
    error: GenerateMuxError
    def __init__(self, request_id: _Optional[str] = ..., chunk: _Optional[_Union[GenerateChunk, _Mapping]] = ..., error: _Optional[_Union[GenerateMuxError, _Mapping]] = ...) -> None: ...

class GenerateMuxError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ProfileRequest(_message.Message):
    __slots__ = ("model_path", "device", "prefill_tokens", "decode_batches", "context_lens", "repeats")
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENS_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    model_path: str
    device: str
    prefill_tokens: _containers.RepeatedScalarFieldContainer[int]
    decode_batches: _containers.RepeatedScalarFieldContainer[int]
    context_lens: _containers.RepeatedScalarFieldContainer[int]
    repeats: int
    def __init__(self, model_path: _Optional[str] = ..., device: _Optional[str] = ..., prefill_tokens: _Optional[_Iterable[int]] = ..., decode_batches: _Optional[_Iterable[int]] = ..., context_lens: _Optional[_Iterable[int]] = ..., repeats: _Optional[int] = ...) -> None: ...

class LayerTiming(_message.Message):
    __slots__ = ("kind", "size", "context_len", "tp", "seconds_per_layer")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_LAYER_FIELD_NUMBER: _ClassVar[int]
    kind: str
    size: int
    context_len: int
    tp: int
    seconds_per_layer: float
    def __init__(self, kind: _Optional[str] = ..., size: _Optional[int] = ..., context_len: _Optional[int] = ..., tp: _Optional[int] = ..., seconds_per_layer: _Optional[float] = ...) -> None: ...

class ProfileReply(_message.Message):
    __slots__ = ("timings", "device", "device_kind", "torch_threads")
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    TORCH_THREADS_FIELD_NUMBER: _ClassVar[int]
    timings: _containers.RepeatedCompositeFieldContainer[LayerTiming]
    device: str
    device_kind: str
    torch_threads: int
    def __init__(self, timings: _Optional[_Iterable[_Union[LayerTiming, _Mapping]]] = ..., device: _Optional[str] = ..., device_kind: _Optional[str] = ..., torch_threads: _Optional[int] = ...) -> None: ...

class FetchTensorsRequest(_message.Message):
    __slots__ = ("replica_id", "stage_index", "names", "chunk_bytes")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    names: _containers.RepeatedScalarFieldContainer[str]
    chunk_bytes: int
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., names: _Optional[_Iterable[str]] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("name", "dtype", "shape", "total_bytes", "offset", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    total_bytes: int
    offset: int
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., total_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PinPrefixRequest(_message.Message):
    __slots__ = ("replica_id", "token_ids")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replica_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReservePagesRequest(_message.Message):
    __slots__ = ("replica_id", "num_pages")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    num_pages: int
    def __init__(self, replica_id: _Optional[str] = ..., num_pages: _Optional[int] = ...) -> None: ...

class PinReply(_message.Message):
    __slots__ = ("pin_id", "page_ids", "num_tokens", "page_size")
    PIN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    pin_id: str
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    page_size: int
    def __init__(self, pin_id: _Optional[str] = ..., page_ids: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class CommitPrefixRequest(_message.Message):
    __slots__ = ("replica_id", "pin_id", "token_ids")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PIN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    pin_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replica_id: _Optional[str] = ..., pin_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitPrefixReply(_message.Message):
    __slots__ = ("registered_pages",)
    REGISTERED_PAGES_FIELD_NUMBER: _ClassVar[int]
    registered_pages: int
    def __init__(self, registered_pages: _Optional[int] = ...) -> None: ...

class ReleasePinRequest(_message.Message):
    __slots__ = ("replica_id", "pin_id")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PIN_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    pin_id: str
    def __init__(self, replica_id: _Optional[str] = ..., pin_id: _Optional[str] = ...) -> None: ...

class ReleasePinReply(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ExportKVRequest(_message.Message):
    __slots__ = ("replica_id", "stage_index", "page_ids", "layer_start", "layer_end", "data_plane")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    layer_start: int
    layer_end: int
    data_plane: DataPlane
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., page_ids: _Optional[_Iterable[int]] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ...) -> None: ...

class KVLayer(_message.Message):
    __slots__ = ("layer", "k", "v")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    V_FIELD_NUMBER: _ClassVar[int]
    layer: int
    k: Tensor
    v: Tensor
    def __init__(self, layer: _Optional[int] = ..., k: _Optional[_Union[Tensor, _Mapping]] = ..., v: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class KVImportHeader(_message.Message):
    __slots__ = ("replica_id", "stage_index", "page_ids", "data_plane", "layer_start", "layer_end")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    data_plane: DataPlane
    layer_start: int
    layer_end: int
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., page_ids: _Optional[_Iterable[int]] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ...) -> None: ...

class KVImportMessage(_message.Message):
    __slots__ = ("header", "layer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    header: KVImportHeader
    layer: KVLayer
    def __init__(self, header: _Optional[_Union[KVImportHeader, _Mapping]] = ..., layer: _Optional[_Union[KVLayer, _Mapping]] = ...) -> None: ...

class ImportKVReply(_message.Message):
    __slots__ = ("layers",)
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    layers: int
    def __init__(self, layers: _Optional[int] = ...) -> None: ...

class VariantAdapter(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class VariantAdaptersRequest(_message.Message):
    __slots__ = ("replica_id", "stage_index", "adapters", "drain_timeout_s")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    adapters: _containers.RepeatedCompositeFieldContainer[VariantAdapter]
    drain_timeout_s: float
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., adapters: _Optional[_Iterable[_Union[VariantAdapter, _Mapping]]] = ..., drain_timeout_s: _Optional[float] = ...) -> None: ...

class VariantAdaptersReply(_message.Message):
    __slots__ = ("variants", "adapter_bytes")
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_BYTES_FIELD_NUMBER: _ClassVar[int]
    variants: _containers.RepeatedScalarFieldContainer[str]
    adapter_bytes: int
    def __init__(self, variants: _Optional[_Iterable[str]] = ..., adapter_bytes: _Optional[int] = ...) -> None: ...

class VariantShare(_message.Message):
    __slots__ = ("foundation_path", "threshold")
    FOUNDATION_PATH_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    foundation_path: str
    threshold: float
    def __init__(self, foundation_path: _Optional[str] = ..., threshold: _Optional[float] = ...) -> None: ...

class BlockStitch(_message.Message):
    __slots__ = ("zoo", "next_model_path", "next_layer_start", "cosine", "top1_agreement", "param_bytes", "folder")
    ZOO_FIELD_NUMBER: _ClassVar[int]
    NEXT_MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    NEXT_LAYER_START_FIELD_NUMBER: _ClassVar[int]
    COSINE_FIELD_NUMBER: _ClassVar[int]
    TOP1_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    FOLDER_FIELD_NUMBER: _ClassVar[int]
    zoo: str
    next_model_path: str
    next_layer_start: int
    cosine: float
    top1_agreement: float
    param_bytes: int
    folder: str
    def __init__(self, zoo: _Optional[str] = ..., next_model_path: _Optional[str] = ..., next_layer_start: _Optional[int] = ..., cosine: _Optional[float] = ..., top1_agreement: _Optional[float] = ..., param_bytes: _Optional[int] = ..., folder: _Optional[str] = ...) -> None: ...

class VariantEquivalenceLayer(_message.Message):
    __slots__ = ("layer", "cosine", "identical", "shared")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    COSINE_FIELD_NUMBER: _ClassVar[int]
    IDENTICAL_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    layer: int
    cosine: float
    identical: bool
    shared: bool
    def __init__(self, layer: _Optional[int] = ..., cosine: _Optional[float] = ..., identical: _Optional[bool] = ..., shared: _Optional[bool] = ...) -> None: ...

class VariantEquivalence(_message.Message):
    __slots__ = ("threshold", "layers", "final_cosine", "top1_agreement", "calibration", "calibration_tokens")
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    FINAL_COSINE_FIELD_NUMBER: _ClassVar[int]
    TOP1_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    layers: _containers.RepeatedCompositeFieldContainer[VariantEquivalenceLayer]
    final_cosine: float
    top1_agreement: float
    calibration: str
    calibration_tokens: int
    def __init__(self, threshold: _Optional[float] = ..., layers: _Optional[_Iterable[_Union[VariantEquivalenceLayer, _Mapping]]] = ..., final_cosine: _Optional[float] = ..., top1_agreement: _Optional[float] = ..., calibration: _Optional[str] = ..., calibration_tokens: _Optional[int] = ...) -> None: ...

class VariantZoo(_message.Message):
    __slots__ = ("param_bytes", "pieces", "shared_pieces")
    PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    SHARED_PIECES_FIELD_NUMBER: _ClassVar[int]
    param_bytes: int
    pieces: int
    shared_pieces: int
    def __init__(self, param_bytes: _Optional[int] = ..., pieces: _Optional[int] = ..., shared_pieces: _Optional[int] = ...) -> None: ...

class ScalingOpRequest(_message.Message):
    __slots__ = ("replica_id", "stage_index", "layer_start", "layer_end", "target_address", "target_device", "holder", "self_address")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TARGET_DEVICE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    SELF_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    layer_start: int
    layer_end: int
    target_address: str
    target_device: str
    holder: str
    self_address: str
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., target_address: _Optional[str] = ..., target_device: _Optional[str] = ..., holder: _Optional[str] = ..., self_address: _Optional[str] = ...) -> None: ...

class ScalingOpReply(_message.Message):
    __slots__ = ("op", "layer_start", "layer_end", "source", "target", "seconds", "pause_s", "param_bytes", "kv_bytes", "kv_pages", "requests")
    OP_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_PAGES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    op: str
    layer_start: int
    layer_end: int
    source: str
    target: str
    seconds: float
    pause_s: float
    param_bytes: int
    kv_bytes: int
    kv_pages: int
    requests: int
    def __init__(self, op: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., source: _Optional[str] = ..., target: _Optional[str] = ..., seconds: _Optional[float] = ..., pause_s: _Optional[float] = ..., param_bytes: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., kv_pages: _Optional[int] = ..., requests: _Optional[int] = ...) -> None: ...

class ScalingRunLoadRequest(_message.Message):
    __slots__ = ("run_id", "model_path", "layer_start", "layer_end", "device", "dtype", "num_pages", "page_size", "source")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    model_path: str
    layer_start: int
    layer_end: int
    device: str
    dtype: str
    num_pages: int
    page_size: int
    source: BlockSource
    def __init__(self, run_id: _Optional[str] = ..., model_path: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., num_pages: _Optional[int] = ..., page_size: _Optional[int] = ..., source: _Optional[_Union[BlockSource, _Mapping]] = ...) -> None: ...

class ScalingRunLoadReply(_message.Message):
    __slots__ = ("holder", "param_bytes", "kv_bytes", "transport")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    holder: str
    param_bytes: int
    kv_bytes: int
    transport: str
    def __init__(self, holder: _Optional[str] = ..., param_bytes: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., transport: _Optional[str] = ...) -> None: ...

class ScalingRunStepRequest(_message.Message):
    __slots__ = ("run_id", "step")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: StageStep
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[_Union[StageStep, _Mapping]] = ...) -> None: ...

class ScalingRunStepReply(_message.Message):
    __slots__ = ("hidden", "seconds")
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    hidden: Tensor
    seconds: float
    def __init__(self, hidden: _Optional[_Union[Tensor, _Mapping]] = ..., seconds: _Optional[float] = ...) -> None: ...

class ScalingRunKVRequest(_message.Message):
    __slots__ = ("run_id", "page_ids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, run_id: _Optional[str] = ..., page_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ScalingRunKVImport(_message.Message):
    __slots__ = ("header", "layer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    header: ScalingRunKVRequest
    layer: KVLayer
    def __init__(self, header: _Optional[_Union[ScalingRunKVRequest, _Mapping]] = ..., layer: _Optional[_Union[KVLayer, _Mapping]] = ...) -> None: ...

class ScalingRunUnloadRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ScalingRunUnloadReply(_message.Message):
    __slots__ = ("unloaded",)
    UNLOADED_FIELD_NUMBER: _ClassVar[int]
    unloaded: bool
    def __init__(self, unloaded: _Optional[bool] = ...) -> None: ...

class ScalingHolderInfo(_message.Message):
    __slots__ = ("name", "requests", "tokens_per_s", "param_bytes", "kv_bytes", "home", "placed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    name: str
    requests: int
    tokens_per_s: float
    param_bytes: int
    kv_bytes: int
    home: bool
    placed: int
    def __init__(self, name: _Optional[str] = ..., requests: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., param_bytes: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., home: _Optional[bool] = ..., placed: _Optional[int] = ...) -> None: ...

class ScalingRunInfo(_message.Message):
    __slots__ = ("replica_id", "stage_index", "layer_start", "layer_end", "origin", "holders")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    layer_start: int
    layer_end: int
    origin: str
    holders: _containers.RepeatedCompositeFieldContainer[ScalingHolderInfo]
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., origin: _Optional[str] = ..., holders: _Optional[_Iterable[_Union[ScalingHolderInfo, _Mapping]]] = ...) -> None: ...

class ScalingBatchLimitRequest(_message.Message):
    __slots__ = ("replica_id", "max_num_seqs")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    max_num_seqs: int
    def __init__(self, replica_id: _Optional[str] = ..., max_num_seqs: _Optional[int] = ...) -> None: ...

class ScalingBatchLimitReply(_message.Message):
    __slots__ = ("previous", "max_num_seqs", "loaded", "running")
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    previous: int
    max_num_seqs: int
    loaded: int
    running: int
    def __init__(self, previous: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., loaded: _Optional[int] = ..., running: _Optional[int] = ...) -> None: ...

class ScalingPending(_message.Message):
    __slots__ = ("replica_id", "stage_index", "layer_start", "layer_end", "target_address", "target_device")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TARGET_DEVICE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    layer_start: int
    layer_end: int
    target_address: str
    target_device: str
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., target_address: _Optional[str] = ..., target_device: _Optional[str] = ...) -> None: ...

class ScalingHostedRun(_message.Message):
    __slots__ = ("run_id", "layer_start", "layer_end", "device", "param_bytes", "kv_bytes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    layer_start: int
    layer_end: int
    device: str
    param_bytes: int
    kv_bytes: int
    def __init__(self, run_id: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., device: _Optional[str] = ..., param_bytes: _Optional[int] = ..., kv_bytes: _Optional[int] = ...) -> None: ...

class OverloadSource(_message.Message):
    __slots__ = ("address", "replica_id", "stage_index", "layer_start", "layer_end")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    address: str
    replica_id: str
    stage_index: int
    layer_start: int
    layer_end: int
    def __init__(self, address: _Optional[str] = ..., replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ...) -> None: ...

class OverloadShiftRequest(_message.Message):
    __slots__ = ("replica_id", "stage_index", "op", "layer_start", "layer_end", "new_replica_id", "new_stage_index", "num_stages", "next_address", "sources", "num_pages", "moves_from", "moves_to")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    NEW_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    MOVES_FROM_FIELD_NUMBER: _ClassVar[int]
    MOVES_TO_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stage_index: int
    op: str
    layer_start: int
    layer_end: int
    new_replica_id: str
    new_stage_index: int
    num_stages: int
    next_address: str
    sources: _containers.RepeatedCompositeFieldContainer[OverloadSource]
    num_pages: int
    moves_from: _containers.RepeatedScalarFieldContainer[int]
    moves_to: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replica_id: _Optional[str] = ..., stage_index: _Optional[int] = ..., op: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., new_replica_id: _Optional[str] = ..., new_stage_index: _Optional[int] = ..., num_stages: _Optional[int] = ..., next_address: _Optional[str] = ..., sources: _Optional[_Iterable[_Union[OverloadSource, _Mapping]]] = ..., num_pages: _Optional[int] = ..., moves_from: _Optional[_Iterable[int]] = ..., moves_to: _Optional[_Iterable[int]] = ...) -> None: ...

class OverloadShiftReply(_message.Message):
    __slots__ = ("layer_start", "layer_end", "param_bytes", "kv_bytes", "kv_pages", "restored_pages", "held_pages", "moves_from", "moves_to", "allocator_pages", "running", "waiting")
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    PARAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_PAGES_FIELD_NUMBER: _ClassVar[int]
    RESTORED_PAGES_FIELD_NUMBER: _ClassVar[int]
    HELD_PAGES_FIELD_NUMBER: _ClassVar[int]
    MOVES_FROM_FIELD_NUMBER: _ClassVar[int]
    MOVES_TO_FIELD_NUMBER: _ClassVar[int]
    ALLOCATOR_PAGES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    layer_start: int
    layer_end: int
    param_bytes: int
    kv_bytes: int
    kv_pages: int
    restored_pages: int
    held_pages: _containers.RepeatedScalarFieldContainer[int]
    moves_from: _containers.RepeatedScalarFieldContainer[int]
    moves_to: _containers.RepeatedScalarFieldContainer[int]
    allocator_pages: int
    running: int
    waiting: int
    def __init__(self, layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., param_bytes: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., kv_pages: _Optional[int] = ..., restored_pages: _Optional[int] = ..., held_pages: _Optional[_Iterable[int]] = ..., moves_from: _Optional[_Iterable[int]] = ..., moves_to: _Optional[_Iterable[int]] = ..., allocator_pages: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class SleepReplicaRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class SleepReplicaReply(_message.Message):
    __slots__ = ("sleeping", "offloaded_bytes", "released_kv_bytes", "seconds")
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    OFFLOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    sleeping: bool
    offloaded_bytes: int
    released_kv_bytes: int
    seconds: float
    def __init__(self, sleeping: _Optional[bool] = ..., offloaded_bytes: _Optional[int] = ..., released_kv_bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class WakeReplicaRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class WakeReplicaReply(_message.Message):
    __slots__ = ("awake", "restored_bytes", "seconds")
    AWAKE_FIELD_NUMBER: _ClassVar[int]
    RESTORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    awake: bool
    restored_bytes: int
    seconds: float
    def __init__(self, awake: _Optional[bool] = ..., restored_bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class BlockSpeculate(_message.Message):
    __slots__ = ("zoo", "kind", "rank", "cosine", "folder", "speculated_steps", "plain_steps", "hits", "misses", "mixed_steps")
    ZOO_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    COSINE_FIELD_NUMBER: _ClassVar[int]
    FOLDER_FIELD_NUMBER: _ClassVar[int]
    SPECULATED_STEPS_FIELD_NUMBER: _ClassVar[int]
    PLAIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    MIXED_STEPS_FIELD_NUMBER: _ClassVar[int]
    zoo: str
    kind: str
    rank: int
    cosine: float
    folder: str
    speculated_steps: int
    plain_steps: int
    hits: int
    misses: int
    mixed_steps: int
    def __init__(self, zoo: _Optional[str] = ..., kind: _Optional[str] = ..., rank: _Optional[int] = ..., cosine: _Optional[float] = ..., folder: _Optional[str] = ..., speculated_steps: _Optional[int] = ..., plain_steps: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., mixed_steps: _Optional[int] = ...) -> None: ...
