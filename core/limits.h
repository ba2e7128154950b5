// GENERATED from core/limits.py by `python3 -m megavm.vm.codegen`: do not edit.
#pragma once

// capacities: programs are validated against these
#define MEGAVM_MAX_TILE_ROWS 256  // output rows of one GEMV tile (their sums live in shared memory)
#ifndef MEGAVM_MAX_K
#define MEGAVM_MAX_K 16384  // floats of the block's activation vector and scratch in shared memory (a program whose tasks state they need fewer is built with fewer, and more ring stages: vm/sizing.py)
#endif
#define MEGAVM_MAX_K_CAPACITY 16384  // what programs are checked against, whatever a build holds
#define MEGAVM_MAX_GROUP 16  // query heads per KV head in one attention partial
#define MEGAVM_MAX_HEAD_DIM 256  // attention head size
#define MEGAVM_MAX_KV_BLOCK 4096  // keys in one attention partial
#define MEGAVM_ATTN_KEY_SPLITS 8  // warps of an attention partial's value sums (head groups x key splits)
#define MEGAVM_MAX_EXPERTS 1024  // experts one router chooses among
#define MEGAVM_MAX_TOPK 32  // experts one router chooses
#define MEGAVM_ROUTE_WARP_EXPERTS 128  // experts ROUTE ranks in one warp's registers, four a lane (without groups or a hash table; more take its shared-memory path)
#define MEGAVM_SAMPLE_CANDIDATES 512  // logits at or above SAMPLE's top-k threshold it ranks in shared memory (more, where many tie at it: k passes over the tiles instead)

// build knobs: override with -DNAME=VALUE
#ifndef MVM_CONSUMER_WARPS
#define MVM_CONSUMER_WARPS 8  // consumer warps per block; one more warp loads the weight ring (with MVM_REG_SPLIT, which is set for 8, a warpgroup of four: the loader and three that exit at once)
#endif
#ifndef MVM_STAGES
#define MVM_STAGES 10  // stages of the shared-memory weight ring; stages x stage bytes + 66 KiB within 227 KiB
#endif
#ifndef MVM_STAGE_BYTES
#define MVM_STAGE_BYTES 16384  // bytes per ring stage: 1, 2 or 4 chunks of 16 bytes per consumer thread
#endif
#ifndef MVM_INFLIGHT
#define MVM_INFLIGHT 2  // weight copies the loader keeps in flight at once
#endif
#ifndef MVM_LAST_INFLIGHT
#define MVM_LAST_INFLIGHT 3  // weight copies the loader keeps in flight for the program's last weight stage (MEGAVM_INSTR_LAST_STAGE: an LLM's LM head), beside which only its own tiles load x (2, MVM_INFLIGHT's value, is the ablation; 3 took llama-1b's LM head 124 us against 133 on an H200, docs/performance.md)
#endif
#ifndef MVM_PREFETCH_TABLES
#define MVM_PREFETCH_TABLES 1  // 1: prefetch an instruction's operand descriptors into L1 before its wait
#endif
#ifndef MVM_ATTN_MMA
#define MVM_ATTN_MMA 1  // 1: the attention partial's scores and value sums on tensor cores where it can (bf16 rows through the ring, head_dim 64, 128 or 256, at most 8 query heads a group; docs/attention.md)
#endif
#ifndef MVM_ATTN_WHOLE_TILES
#define MVM_ATTN_WHOLE_TILES 1  // 1: the tensor-core partial's loops take whole tiles of history keys without per-key checks first (docs/attention.md); 0: every tile through the checked loop (an ablation)
#endif
#ifndef MVM_COMBINE_LOADS
#define MVM_COMBINE_LOADS 4  // blocks' partial sums an attention combine thread loads before it waits for the first (1: each load after the last one's tag is seen, an ablation; 4 took llama-1b 1.4-3.7% faster at ctx 4096 and 32768 with the 224-register block, and 0.5-3% slower at ctx 128, within noise; docs/attention.md)
#endif
#ifndef MVM_REG_SPLIT
#define MVM_REG_SPLIT 1  // 1: 12 warps a block, the loader's warpgroup giving registers back (setmaxnreg, sm_90a) so the consumers get 224 instead of the 168 that 9 warps allow (docs/performance.md, "Why 168"); 0: 9 warps (an ablation)
#endif
#ifndef MVM_RELAXED_SIGNALS
#define MVM_RELAXED_SIGNALS 1  // 1: an instruction whose counter no wait on the GPU acquires (every wait on it polled: MEGAVM_INSTR_SIGNAL_RELAXED) increments it relaxed, without the release; 0: every signal a release (an ablation)
#endif
#ifndef MVM_PROBE_ATTN_CUT
#define MVM_PROBE_ATTN_CUT 0  // research probe: 1 skips the attention partial's score and value arithmetic, 2 its value arithmetic (stages still waited for and released; results wrong by construction)
#endif
#ifndef MVM_E4M3_ATTN_LO
#define MVM_E4M3_ATTN_LO 0  // 1: the tensor-core partial on e4m3 KV codes multiplies the lo f16 parts of q and p too (about 22 bits of them instead of 11; twice the products)
#endif
#ifndef MVM_PROBE_E4M3_CVT
#define MVM_PROBE_E4M3_CVT 0  // research probe: 1 turns e4m3 KV codes into f16 operands by a bit move instead of the conversion (results wrong by construction)
#endif
#ifndef MVM_INLINE_TASKS
#define MVM_INLINE_TASKS 0  // 1: the kernel runs an inline task (docs/ir.md) where its wait completes; 0: MegakernelVM refuses programs with one (1 is correct on an H100 but slower: llama-1b 1.11 ms against 1.06-1.08, with or without inline combines)
#endif
#ifndef MVM_E2M1_MMA
#define MVM_E2M1_MMA 0  // 1: e2m1 (NVFP4) GEMVs on tensor cores where the tile fits (instructions/gemv_mma.cuh; research: llama-1b nvfp4 1.033 ms against 1.082, docs/quantization.md)
#endif
#ifndef MVM_TWO_ROWS
#define MVM_TWO_ROWS 1  // which packed 4-bit GEMVs take a warp's two whole short rows (K <= 2048) in a stage at once, each activation run read once for both: 1 int4, 2 e2m1 (NVFP4), 4 mxfp4, or a sum (llama-1b int4 0.98 ms against 1.17 with 0, NVFP4 0.998 against 0.982 with 2; docs/quantization.md)
#endif
#ifndef MVM_E2M1_F8
#define MVM_E2M1_F8 96  // N > 0: NVFP4 tiles of N rows or more of K = 2048 and 4096 (of a 2-D weight, those gemv_xreg does not take: by default K = 4096) on e4m3 tensor cores where their B fragments fit in xs above x (instructions/gemv_f8.cuh; H200 llama-7b-32k nvfp4 3.00-3.01 ms against 3.18-3.20 with 0, docs/quantization.md); 0: off
#endif
#ifndef MVM_U4_IMMA
#define MVM_U4_IMMA 32  // N > 0: int4 (AWQ) tiles of N rows or more of K = 2048 and 4096 (of a 2-D weight) on the integer tensor cores, u8 codes x x in four s8 parts, exact sums, where their B fragments fit in xs above x (instructions/gemv_imma.cuh; H200 llama-7b-32k int4 2.581 ms with MVM_U4_IMMA_LONG at 32, against 2.699 at 96, at ae6fbe4; docs/quantization.md); 0: off
#endif
#ifndef MVM_U4_TAB_AHEAD
#define MVM_U4_TAB_AHEAD 3  // groups of 16 rows ahead that the int4 integer tensor-core path copies each warp's slice of the group table (f16 scale and zero) into shared memory by cp.async, a ring of N + 1 slots above the group sums (instructions/gemv_imma.cuh); 0: each (scale, zero) pair from global memory (L2) one group of 128 codes ahead
#endif
#ifndef MVM_PROBE_U4_NOTAB
#define MVM_PROBE_U4_NOTAB 0  // research probe: 1 makes the int4 integer tensor-core path read no group table (scale 1, zero 8 for every group; results wrong by construction)
#endif
#ifndef MVM_U4_IMMA_LONG
#define MVM_U4_IMMA_LONG 32  // N > 0: int4 (AWQ) tiles of N to 64 rows of a 2-D weight whose K is a multiple of 2048 past 4096 (down projections: llama-7b-32k's 14336 in tiles of 32 rows; llama-1b's 8192 in 16), of an opcode done with x after its GEMV (LINEAR_RESIDUAL), on the integer tensor cores with B's fragments in x's own place (instructions/gemv_imma.cuh; H200 llama-7b-32k int4 2.581 ms against 2.703 with 0, at ae6fbe4; llama-1b int4 0.882-0.886 at 1 against 0.830-0.833 with 0, at 61b3ba9; docs/quantization.md); 0: off
#endif
#ifndef MVM_XREG
#define MVM_XREG 7  // which packed 4-bit GEMVs take rows of K = 2048 with each lane's 64 activations held in registers for the whole tile (gemv_core.cuh: gemv_xreg): 1 int4, 2 e2m1 (NVFP4), 4 mxfp4, or a sum (H200 llama-1b nvfp4 0.830-0.842 ms against 0.859-0.861 with 0, int4 0.823-0.827 against 0.847-0.861, mxfp4 0.797-0.799 against 0.828-0.834; docs/quantization.md)
#endif
#ifndef MVM_XREG_WIDE
#define MVM_XREG_WIDE 1  // which of those also take rows of K = 4096, two warps a row (H200 llama-7b-32k int4 3.313 ms against 3.506 without gemv_xreg; NVFP4's were slower, 3.213 against 3.166)
#endif
#ifndef MVM_ROW_PAIRS
#define MVM_ROW_PAIRS 1  // 1: bf16 rows of K <= MVM_ROW_PAIRS_MAX_K that are not whole 4 KiB chunks (K = 1024, 1536, 2816, 6144) take gemv_rows_bf16, two adjacent rows a warp by shared address; 0: gemv_core's row-per-warp loop
#endif
#ifndef MVM_ROW_PAIRS_MAX_K
#define MVM_ROW_PAIRS_MAX_K 8192  // the longest bf16 row (not whole 4 KiB chunks) gemv_rows_bf16 takes; longer rows take gemv_core's stage-by-stage walk. A warp holds both rows of a pair until it has summed them, so a pair must fit the ring (at most 16384)
#endif
#ifndef MVM_LATE_SLEEP_MAX
#define MVM_LATE_SLEEP_MAX 1024  // the loader's longest sleep (ns) between polls of the counter a late-bound (expert) stream waits on; it doubles from 64 (every SM's loader may poll one router's counter at once)
#endif
#ifndef MVM_DOWN_PAIRS
#define MVM_DOWN_PAIRS 1  // 1: EXPERT_DOWN's bf16 experts of F <= 1024 columns and at most two rows a warp take gemv_experts_pairs (two experts a trip, each row's pieces by shared address); 0: the row-per-warp loop
#endif
#ifndef MVM_KV_E2M1
#define MVM_KV_E2M1 0  // non-zero: the attention partial reads NVFP4 (e2m1) KV caches, on tensor cores at head_dim 64 or 128 when it is that number (one head_dim a build), else on CUDA cores; MegakernelVM builds it with the cache's head_dim for programs that hold one (its call site makes the main loop spill, so others do without)
#endif
#ifndef MVM_PROBE_LOADER
#define MVM_PROBE_LOADER 0  // 1: the loader times its waits and each eighth block prints them (research probe)
#endif
#ifndef MVM_TAG_FENCE
#define MVM_TAG_FENCE 0  // 1: gpu-scope fences before tagged stores and after tag polls (research: llama-1b 1.22 ms against 1.10 without; the validator orders untagged reads by counters instead, docs/ir.md)
#endif
#ifndef MVM_TAG_SLEEP
#define MVM_TAG_SLEEP 64  // nanoseconds a tag poll sleeps between its reads of a word not yet written (0: spin)
#endif
