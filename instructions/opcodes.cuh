// GENERATED from the specs in instructions/ by `python3 -m megavm.vm.codegen`: do not edit.
// The opcode codes, and per opcode a struct whose static functions read an instruction's
// operands (buffer ids) and params by the names its spec gives them.
#pragma once
#include "../core/abi.h"

enum mvm_opcode {
  MVM_OP_EMBED = 0,
  MVM_OP_RMS_LINEAR = 1,
  MVM_OP_RMS_LINEAR_ROPE = 2,
  MVM_OP_RMS_LINEAR_KV = 3,
  MVM_OP_RMS_GLU = 4,
  MVM_OP_LINEAR_RESIDUAL = 5,
  MVM_OP_ATTN_PARTIAL = 6,
  MVM_OP_ATTN_COMBINE = 7,
  MVM_OP_RMS_LINEAR_ARGMAX = 8,
  MVM_OP_ARGMAX = 9,
  MVM_OP_RMSNORM = 10,
  MVM_OP_LINEAR = 11,
  MVM_OP_ADD = 12,
  MVM_OP_ROPE = 13,
  MVM_OP_KV_APPEND = 14,
  MVM_OP_EMB_GATHER = 15,
  MVM_OP_INTERACT = 16,
  MVM_OP_ROUTE = 17,
  MVM_OP_EXPERT_GLU = 18,
  MVM_OP_EXPERT_DOWN = 19,
  MVM_OP_SAMPLE = 20,
  MVM_OP_RMS_LINEAR_AMAX = 21,
  MVM_OP_KV_QUANT = 22,
  MVM_OP_LORA_A = 23,
  MVM_OP_COUNT = 24
};

// activation codes (instructions/activations.py)
enum mvm_act {
  ACT_NONE = 0,
  ACT_RELU = 1,
  ACT_SIGMOID = 2,
  ACT_SILU = 3,
  ACT_GELU = 4,
  ACT_GELU_TANH = 5,
};

// EMBED: x[col0:col0+ncols] = scale * table[token, col0:col0+ncols], the token a runtime input (scale: 1, or sqrt(dim) for Gemma). With LoRA on layer 0's q/k/v, it also writes its partial product of their A with its columns of x (instructions/lora.py).
struct EMBED {
  static constexpr int code = MVM_OP_EMBED;
  static __device__ __forceinline__ int table(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int token(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int next_a(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int adapter(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int next_gamma(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int next_u(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int col0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int ncols(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ float scale(const mvm_instr_t* i) { return __uint_as_float(i->params[2]); }
  static __device__ __forceinline__ int lora_t(const mvm_instr_t* i) { return (int)i->params[3]; }
};

// RMS_LINEAR: y[row0:row0+nrows] = W[row0:row0+nrows] @ rmsnorm(x, gamma).
struct RMS_LINEAR {
  static constexpr int code = MVM_OP_RMS_LINEAR;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int w(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[2]); }
  static __device__ __forceinline__ int norm(const mvm_instr_t* i) { return (int)i->params[3]; }
};

// RMS_LINEAR_ROPE: the query projection tile, rmsnorm then W[rows] @ x (plus its LoRA term where present, instructions/lora.py), then its epilogue: the bias and per-head norm where present (instructions/qkv.py), and RoPE at position pos (instructions/rotary.py: rows in interleaved pairs).
struct RMS_LINEAR_ROPE {
  static constexpr int code = MVM_OP_RMS_LINEAR_ROPE;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int w(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int pos(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int freqs(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int bias(const mvm_instr_t* i) { return i->inputs[5]; }
  static __device__ __forceinline__ int head_norm(const mvm_instr_t* i) { return i->inputs[6]; }
  static __device__ __forceinline__ int lora_u(const mvm_instr_t* i) { return i->inputs[7]; }
  static __device__ __forceinline__ int lora_b(const mvm_instr_t* i) { return i->inputs[8]; }
  static __device__ __forceinline__ int adapter(const mvm_instr_t* i) { return i->inputs[9]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[2]); }
  static __device__ __forceinline__ int norm(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ int head_dim(const mvm_instr_t* i) { return (int)i->params[4]; }
  static __device__ __forceinline__ int lora_off(const mvm_instr_t* i) { return (int)i->params[5]; }
};

// RMS_LINEAR_KV: a key or value projection tile, rmsnorm then W[rows] @ x (plus its LoRA term where present, instructions/lora.py), whose epilogue (the bias and per-head norm where present, instructions/qkv.py; then RoPE, for keys) appends the rows to the KV cache at position pos (instructions/kv_cache.py). With `row`, it also writes them in f32 to that vector (tagged: the attention partials of this step read their own row there, docs/ir.md).
struct RMS_LINEAR_KV {
  static constexpr int code = MVM_OP_RMS_LINEAR_KV;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int w(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int pos(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int freqs(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int bias(const mvm_instr_t* i) { return i->inputs[5]; }
  static __device__ __forceinline__ int head_norm(const mvm_instr_t* i) { return i->inputs[6]; }
  static __device__ __forceinline__ int lora_u(const mvm_instr_t* i) { return i->inputs[7]; }
  static __device__ __forceinline__ int lora_b(const mvm_instr_t* i) { return i->inputs[8]; }
  static __device__ __forceinline__ int adapter(const mvm_instr_t* i) { return i->inputs[9]; }
  static __device__ __forceinline__ int cache(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[2]); }
  static __device__ __forceinline__ int norm(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ int head_dim(const mvm_instr_t* i) { return (int)i->params[4]; }
  static __device__ __forceinline__ int rope(const mvm_instr_t* i) { return (int)i->params[5]; }
  static __device__ __forceinline__ int lora_off(const mvm_instr_t* i) { return (int)i->params[6]; }
};

// RMS_GLU: h[rows] = act(Wg[rows] @ n) * (Wu[rows] @ n), n = rmsnorm(x, gamma): the gate and up projections of a gated MLP in one tile (act silu: SwiGLU; gelu_tanh: Gemma's GeGLU). With limit > 0 (DeepSeek-V4's swiglu_limit) the gate is clamped above at limit and the up projection to [-limit, limit] before they meet.
struct RMS_GLU {
  static constexpr int code = MVM_OP_RMS_GLU;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int wg(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int wu(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int lora_u(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int lora_b(const mvm_instr_t* i) { return i->inputs[5]; }
  static __device__ __forceinline__ int adapter(const mvm_instr_t* i) { return i->inputs[6]; }
  static __device__ __forceinline__ int next_a(const mvm_instr_t* i) { return i->inputs[7]; }
  static __device__ __forceinline__ int h(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int next_u(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[2]); }
  static __device__ __forceinline__ int norm(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ int act(const mvm_instr_t* i) { return (int)i->params[4]; }
  static __device__ __forceinline__ int lora_off(const mvm_instr_t* i) { return (int)i->params[5]; }
  static __device__ __forceinline__ int lora_t(const mvm_instr_t* i) { return (int)i->params[6]; }
  static __device__ __forceinline__ float limit(const mvm_instr_t* i) { return __uint_as_float(i->params[7]); }
};

// LINEAR_RESIDUAL: y[rows] = res[rows] + W[rows] @ a: the o-projection and down-projection tiles with the residual add in their epilogue.
struct LINEAR_RESIDUAL {
  static constexpr int code = MVM_OP_LINEAR_RESIDUAL;
  static __device__ __forceinline__ int a(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int w(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int res(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int lora_u(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int lora_b(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int adapter(const mvm_instr_t* i) { return i->inputs[5]; }
  static __device__ __forceinline__ int next_a(const mvm_instr_t* i) { return i->inputs[6]; }
  static __device__ __forceinline__ int next_gamma(const mvm_instr_t* i) { return i->inputs[7]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int next_u(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ int lora_off(const mvm_instr_t* i) { return (int)i->params[2]; }
  static __device__ __forceinline__ int lora_t(const mvm_instr_t* i) { return (int)i->params[3]; }
};

// ATTN_PARTIAL: one (KV head, KV block) of decode attention -> a partial (m, l, acc) per query head of the KV head's group, over the block's keys up to pos (with one block a KV head, the output may instead be the attention output itself, [q's shape], each of the head's rows acc / l: what ATTN_COMBINE makes of one block); with a sliding window, only the last `window` positions' keys (instructions/attention.py). A quantized cache (instructions/kv_quant.py) comes with its scales [kv_heads, capacity]: e4m3 key and value rows are code x their position's scale; e2m1 (NVFP4) rows also take their block scales [kv_heads, capacity, head_dim / 16] (k_bscale, v_bscale): e2m1(code) x block scale x the position's scale.
struct ATTN_PARTIAL {
  static constexpr int code = MVM_OP_ATTN_PARTIAL;
  static __device__ __forceinline__ int q(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int k_cache(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int v_cache(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int pos(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int k_scale(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int v_scale(const mvm_instr_t* i) { return i->inputs[5]; }
  static __device__ __forceinline__ int k_row(const mvm_instr_t* i) { return i->inputs[6]; }
  static __device__ __forceinline__ int v_row(const mvm_instr_t* i) { return i->inputs[7]; }
  static __device__ __forceinline__ int k_bscale(const mvm_instr_t* i) { return i->inputs[8]; }
  static __device__ __forceinline__ int v_bscale(const mvm_instr_t* i) { return i->inputs[9]; }
  static __device__ __forceinline__ int part(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int kv_head(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int block(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ int block_size(const mvm_instr_t* i) { return (int)i->params[2]; }
  static __device__ __forceinline__ float scale(const mvm_instr_t* i) { return __uint_as_float(i->params[3]); }
  static __device__ __forceinline__ int window(const mvm_instr_t* i) { return (int)i->params[4]; }
};

// ATTN_COMBINE: merge the blocks' partials of one KV head, in block order, into the attention output of its query heads (instructions/attention.py), all of the group's or a range of them (q0, q_heads: several tasks share a group's work). With LoRA on the o-projection, it also writes its partial product of that A with its rows of the output (instructions/lora.py).
struct ATTN_COMBINE {
  static constexpr int code = MVM_OP_ATTN_COMBINE;
  static __device__ __forceinline__ int part(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int next_a(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int adapter(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int attn(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int next_u(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int kv_head(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int lora_t(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ int q0(const mvm_instr_t* i) { return (int)i->params[2]; }
  static __device__ __forceinline__ int q_heads(const mvm_instr_t* i) { return (int)i->params[3]; }
};

// RMS_LINEAR_ARGMAX: an LM-head tile, rmsnorm then W[rows] @ x, writing its logits and a (max, index) partial into best[tile] for ARGMAX. Ties go to the lowest index, as torch.argmax does.
struct RMS_LINEAR_ARGMAX {
  static constexpr int code = MVM_OP_RMS_LINEAR_ARGMAX;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int w(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int logits(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int best(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[2]); }
  static __device__ __forceinline__ int norm(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ int tile(const mvm_instr_t* i) { return (int)i->params[4]; }
};

// ARGMAX: the step's next token, the index of the largest logit (ties to the lowest index), from the (tiles, 2) partials of RMS_LINEAR_ARGMAX; given the (vocab,) logits instead, it scans every logit itself (the unfused ablation). Under the in-kernel token loop it also feeds the next step.
struct ARGMAX {
  static constexpr int code = MVM_OP_ARGMAX;
  static __device__ __forceinline__ int best(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int token(const mvm_instr_t* i) { return i->outputs[0]; }
};

// RMSNORM: y = gamma * x / rms(x) over the whole vector, in f32: the unfused ablation of the RMSNorm that every RMS_* projection otherwise recomputes in its prologue (their param norm is 0 then).
struct RMSNORM {
  static constexpr int code = MVM_OP_RMSNORM;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[0]); }
};

// LINEAR: y[b, rows] = act(W[rows] @ x[b] + bias[rows] + mult * res[b, rows]) for the tile's batch rows b: the generic fused epilogue. bias and res are optional; act is one of the activation codes (instructions/activations.py). x and y are vectors (one batch row) or [batch, features] matrices.
struct LINEAR {
  static constexpr int code = MVM_OP_LINEAR;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int w(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int bias(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int res(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ int b0(const mvm_instr_t* i) { return (int)i->params[2]; }
  static __device__ __forceinline__ int nb(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ int act(const mvm_instr_t* i) { return (int)i->params[4]; }
  static __device__ __forceinline__ float mult(const mvm_instr_t* i) { return __uint_as_float(i->params[5]); }
};

// ADD: y[rows] = a[rows] + b[rows], in that order (the f32 sums LINEAR_RESIDUAL's epilogue makes): the residual add of the unfused ablation.
struct ADD {
  static constexpr int code = MVM_OP_ADD;
  static __device__ __forceinline__ int a(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int b(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
};

// ROPE: y[rows] = rows of a, with their bias and per-head norm where present (instructions/qkv.py), rotated at position pos (instructions/rotary.py): the unfused form of RMS_LINEAR_ROPE's epilogue, and the task that finishes q tiles too short for a whole-head norm (Qwen3's q_norm).
struct ROPE {
  static constexpr int code = MVM_OP_ROPE;
  static __device__ __forceinline__ int a(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int pos(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int freqs(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int bias(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int head_norm(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ int head_dim(const mvm_instr_t* i) { return (int)i->params[2]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[3]); }
};

// KV_APPEND: rows of a vector, with their bias and per-head norm where present (instructions/qkv.py), rotated for keys, appended to the KV cache at position pos (instructions/kv_cache.py): the unfused form of RMS_LINEAR_KV's epilogue, and the task that finishes k tiles too short for a whole-head norm (Qwen3's k_norm). With `row`, it also writes the rows as appended, in f32, to that vector (tagged: this step's attention partials read their own row there, as from RMS_LINEAR_KV's, docs/ir.md).
struct KV_APPEND {
  static constexpr int code = MVM_OP_KV_APPEND;
  static __device__ __forceinline__ int a(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int pos(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int freqs(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int bias(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int head_norm(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int cache(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ int head_dim(const mvm_instr_t* i) { return (int)i->params[2]; }
  static __device__ __forceinline__ int rope(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[4]); }
};

// EMB_GATHER: e[b, f] = table[(ids[b, f] + 1) % rows(table)] for the tile's batch rows b: one sparse feature's embedding lookup, its raw ids (a runtime input, each >= 0) hashed to table rows by the modulus hash. Only the gathered rows are read; tables may hold millions of rows.
struct EMB_GATHER {
  static constexpr int code = MVM_OP_EMB_GATHER;
  static __device__ __forceinline__ int table(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int ids(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int e(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int feature(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int b0(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ int nb(const mvm_instr_t* i) { return (int)i->params[2]; }
};

// INTERACT: y[b] = [z[b], <t_i, t_j> for i > j, 0 ...] for the tile's batch rows b, where t_0 = z[b] and t_1.. = e[b, 0..]: DLRM's pairwise dot-product interaction (no self-interaction), pairs in the order i = 1.., j = 0..i-1, then zeros to y's width (the next layer's rows are padded to a multiple of 8 columns).
struct INTERACT {
  static constexpr int code = MVM_OP_INTERACT;
  static __device__ __forceinline__ int z(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int e(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int b0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nb(const mvm_instr_t* i) { return (int)i->params[1]; }
};

// ROUTE: a mixture-of-experts router's choice, from the router logits of its GEMV tiles: per-expert scores (softmax, sigmoid or sqrt-softplus), an optional ranking bias, grouped top-k, the stable top-k (ties to the lower id, NaN last), then the weights of the chosen experts from the UNbiased scores, renormalised (sum + eps; a zero sum gives zero weights) and scaled, in slot order. With a hash table the ids are table[token] instead, and the weights the scores there; a hash-routed layer splits in two ROUTE tasks: one without logits writes the ids alone at the step's start (so the loader streams the chosen experts as early as a dense layer's), one without the ids output writes the weights once the logits are in. instructions/routing.py is the specification; the expert opcodes read the ids it writes.
struct ROUTE {
  static constexpr int code = MVM_OP_ROUTE;
  static __device__ __forceinline__ int logits(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int bias(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int table(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int token(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int ids(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int weights(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int score(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int n_group(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ int topk_group(const mvm_instr_t* i) { return (int)i->params[2]; }
  static __device__ __forceinline__ int renorm(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[4]); }
  static __device__ __forceinline__ float scale(const mvm_instr_t* i) { return __uint_as_float(i->params[5]); }
};

// EXPERT_GLU: h[slot, rows] = act(Wg[e][rows] @ n) * (Wu[e][rows] @ n) for the expert e = ids[slot] a ROUTE task chose, n = rmsnorm(x, gamma): the gate and up projections of one chosen expert, one tile of its rows. With limit > 0 (DeepSeek-V4's swiglu_limit) the gate is clamped above at limit and the up projection to [-limit, limit] before they meet. The loader streams the expert's rows as soon as the ids are written (late-bound streams). h may be tagged (docs/ir.md): EXPERT_DOWN polls its words instead of waiting on the GLU tiles' counter.
struct EXPERT_GLU {
  static constexpr int code = MVM_OP_EXPERT_GLU;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int wg(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int wu(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int ids(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int h(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[2]); }
  static __device__ __forceinline__ int norm(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ int act(const mvm_instr_t* i) { return (int)i->params[4]; }
  static __device__ __forceinline__ int slot(const mvm_instr_t* i) { return (int)i->params[5]; }
  static __device__ __forceinline__ float limit(const mvm_instr_t* i) { return __uint_as_float(i->params[6]); }
};

// EXPERT_DOWN: y[rows] = res[rows] + Ws[rows] @ hs + sum over j < k of weights[j] * (Wd[ids[j]][rows] @ h[j]): the down projections of a shared expert (optional: hs, Ws) and of the k chosen experts, summed into the residual stream, one tile of its rows. The sum runs in that order, the experts in slot order j = 0, 1, ..., so results are bitwise reproducible. The loader streams the shared rows ahead of the wait, and each chosen expert's rows as soon as the ids are written (one late-bound stream of k runs). h, res and y may be tagged (docs/ir.md): the GLU tiles' h reaches the down tiles, and the residual stream the next layer's tiles, by polled waits.
struct EXPERT_DOWN {
  static constexpr int code = MVM_OP_EXPERT_DOWN;
  static __device__ __forceinline__ int h(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int wd(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int ids(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int weights(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int res(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int h_shared(const mvm_instr_t* i) { return i->inputs[5]; }
  static __device__ __forceinline__ int w_shared(const mvm_instr_t* i) { return i->inputs[6]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
};

// SAMPLE: the step's next token drawn from the logits: temperature, top-k and top-p with one uniform draw of Philox4x64-10 keyed by the seed at the step's position (instructions/sampling.py is the specification). Temperature 0 is greedy, from the LM-head tiles' (max, index) partials as ARGMAX. With top_k > 0 the candidates are the logits at or above the k-th best tile maximum (every element of the top k is), gathered into shared memory in one pass and ranked there by counting (past SAMPLE_CANDIDATES of them, by k block-wide passes, each taking the first element after the last pick); with top_k 0 (and top_p 1) the draw walks every logit in id order, its sums in f64. Under the in-kernel token loop the token also feeds the next step.
struct SAMPLE {
  static constexpr int code = MVM_OP_SAMPLE;
  static __device__ __forceinline__ int logits(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int best(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int sampling(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int seed(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int pos(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int token(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int tile_rows(const mvm_instr_t* i) { return (int)i->params[0]; }
};

// RMS_LINEAR_AMAX: a key or value tile for a quantized KV cache, rmsnorm then W[rows] @ x (plus its LoRA term where present), its epilogue as RMS_LINEAR_KV's (bias and per-head norm where present, then RoPE for keys), writing the finished rows to y and their largest magnitude to amax[tile]: the first of the two dependent steps of a quantized append, KV_QUANT the second (instructions/kv_quant.py). Its device code is RMS_LINEAR_KV's (instructions/rms_linear_kv.cuh), which branches on the opcode.
struct RMS_LINEAR_AMAX {
  static constexpr int code = MVM_OP_RMS_LINEAR_AMAX;
  static __device__ __forceinline__ int x(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int w(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int pos(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int freqs(const mvm_instr_t* i) { return i->inputs[4]; }
  static __device__ __forceinline__ int bias(const mvm_instr_t* i) { return i->inputs[5]; }
  static __device__ __forceinline__ int head_norm(const mvm_instr_t* i) { return i->inputs[6]; }
  static __device__ __forceinline__ int lora_u(const mvm_instr_t* i) { return i->inputs[7]; }
  static __device__ __forceinline__ int lora_b(const mvm_instr_t* i) { return i->inputs[8]; }
  static __device__ __forceinline__ int adapter(const mvm_instr_t* i) { return i->inputs[9]; }
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int amax(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
  static __device__ __forceinline__ float eps(const mvm_instr_t* i) { return __uint_as_float(i->params[2]); }
  static __device__ __forceinline__ int norm(const mvm_instr_t* i) { return (int)i->params[3]; }
  static __device__ __forceinline__ int head_dim(const mvm_instr_t* i) { return (int)i->params[4]; }
  static __device__ __forceinline__ int rope(const mvm_instr_t* i) { return (int)i->params[5]; }
  static __device__ __forceinline__ int lora_off(const mvm_instr_t* i) { return (int)i->params[6]; }
  static __device__ __forceinline__ int tile(const mvm_instr_t* i) { return (int)i->params[7]; }
};

// KV_QUANT: the second of a quantized append's two dependent steps. Once every producer tile of the new K (or V) row has written it to y and its partial amax (RMS_LINEAR_AMAX), it reduces the partials to the row's amax over every KV head and appends KV head kv_head's rows at position pos: - to an e4m3 cache, as codes e4m3(y / scale), scale = amax / 448 (at their swizzled places,   instructions/kv_cache.py), the scale beside them in scale[kv_head, pos] (an all-zero row: scale 0,   codes 0). A reader dequantizes code x scale. - to an e2m1 (NVFP4) cache, as vLLM's reference NVFP4 quantizer does a tensor of that amax   (core/codecs.py: nvfp4_rows): global = 448 x 6 / amax, an e4m3 scale per 16 elements in   block_scale[kv_head, pos], codes e2m1(y / (block scale / global)), scale[kv_head, pos] = 1 / global.   A reader dequantizes e2m1(code) x block scale x scale. It must wait for every producer of amax: reading the partials before the last is written is the race the validator refuses (a scale from part of the row, codes that saturate).
struct KV_QUANT {
  static constexpr int code = MVM_OP_KV_QUANT;
  static __device__ __forceinline__ int y(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int amax(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int pos(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int cache(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int scale(const mvm_instr_t* i) { return i->outputs[1]; }
  static __device__ __forceinline__ int block_scale(const mvm_instr_t* i) { return i->outputs[2]; }
  static __device__ __forceinline__ int kv_head(const mvm_instr_t* i) { return (int)i->params[0]; }
};

// LORA_A: some rows of a LoRA group's down product, u[0, row0:row0+nrows] = A[id, row0:row0+nrows] (g v), over the whole input vector v of the group's projections (the layer's x, the attention output, mid or the GLU output), g its RMSNorm weight or 1. The group's projection tiles read u (instructions/lora.py); nothing is written for id 0. The task's rows of A are copied into shared memory before its wait (kept in L2 from step to step), and g with them, so after the wait only v's words and the dot products remain: off the chain as long as they land before the projections' GEMVs end (docs/ir.md, "LoRA adapters").
struct LORA_A {
  static constexpr int code = MVM_OP_LORA_A;
  static __device__ __forceinline__ int v(const mvm_instr_t* i) { return i->inputs[0]; }
  static __device__ __forceinline__ int a(const mvm_instr_t* i) { return i->inputs[1]; }
  static __device__ __forceinline__ int adapter(const mvm_instr_t* i) { return i->inputs[2]; }
  static __device__ __forceinline__ int gamma(const mvm_instr_t* i) { return i->inputs[3]; }
  static __device__ __forceinline__ int u(const mvm_instr_t* i) { return i->outputs[0]; }
  static __device__ __forceinline__ int row0(const mvm_instr_t* i) { return (int)i->params[0]; }
  static __device__ __forceinline__ int nrows(const mvm_instr_t* i) { return (int)i->params[1]; }
};
