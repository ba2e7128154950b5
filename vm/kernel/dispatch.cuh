// GENERATED from the specs in instructions/ by `python3 -m megavm.vm.codegen`: do not edit.
// The kernel's per-opcode tables (included by megakernel.cu).
#pragma once
#include "../../instructions/embed.cuh"
#include "../../instructions/rms_linear.cuh"
#include "../../instructions/rms_linear_rope.cuh"
#include "../../instructions/rms_linear_kv.cuh"
#include "../../instructions/rms_glu.cuh"
#include "../../instructions/linear_residual.cuh"
#include "../../instructions/attn_partial.cuh"
#include "../../instructions/attn_combine.cuh"
#include "../../instructions/rms_linear_argmax.cuh"
#include "../../instructions/argmax.cuh"
#include "../../instructions/rmsnorm.cuh"
#include "../../instructions/linear.cuh"
#include "../../instructions/add.cuh"
#include "../../instructions/rope.cuh"
#include "../../instructions/kv_append.cuh"
#include "../../instructions/emb_gather.cuh"
#include "../../instructions/interact.cuh"
#include "../../instructions/route.cuh"
#include "../../instructions/expert_glu.cuh"
#include "../../instructions/expert_down.cuh"
#include "../../instructions/sample.cuh"
#include "../../instructions/kv_quant.cuh"
#include "../../instructions/lora_a.cuh"

static_assert(MVM_OP_COUNT == 24, "opcodes.cuh and dispatch.cuh are generated together");

// Before the instruction's waits: what its opcode fetches that no counter guards (OpSpec.prewait).
__device__ __forceinline__ void prewait(mvm_ctx& c) {
  switch (c.ins->opcode) {
    case MVM_OP_RMS_LINEAR:
    case MVM_OP_RMS_LINEAR_ROPE:
    case MVM_OP_RMS_LINEAR_KV:
    case MVM_OP_RMS_GLU:
    case MVM_OP_RMS_LINEAR_ARGMAX:
    case MVM_OP_EXPERT_GLU:
    case MVM_OP_RMS_LINEAR_AMAX:
      rms_prewait(c, RMS_LINEAR::norm(c.ins), RMS_LINEAR::gamma(c.ins), RMS_LINEAR::w(c.ins));
      break;
    case MVM_OP_ATTN_PARTIAL:
      scales_prewait(c, ATTN_PARTIAL::k_cache(c.ins), ATTN_PARTIAL::k_scale(c.ins), ATTN_PARTIAL::v_scale(c.ins), ATTN_PARTIAL::k_bscale(c.ins), ATTN_PARTIAL::v_bscale(c.ins), ATTN_PARTIAL::kv_head(c.ins), ATTN_PARTIAL::block(c.ins), ATTN_PARTIAL::block_size(c.ins));
      break;
    case MVM_OP_ROPE:
    case MVM_OP_KV_APPEND:
      finish_prewait(c, ROPE::row0(c.ins), ROPE::nrows(c.ins), ROPE::head_dim(c.ins), ROPE::freqs(c.ins), ROPE::bias(c.ins), ROPE::head_norm(c.ins));
      break;
    case MVM_OP_LORA_A:
      lora_a_prewait(c, LORA_A::a(c.ins), LORA_A::adapter(c.ins), LORA_A::gamma(c.ins), LORA_A::row0(c.ins), LORA_A::nrows(c.ins));
      break;
    default: break;
  }
}

// Run the instruction's opcode; an unknown opcode aborts the launch with a dump.
__device__ __forceinline__ bool dispatch(mvm_ctx& c) {
  switch (c.ins->opcode) {
    case MVM_OP_EMBED: return op_embed(c);
    case MVM_OP_RMS_LINEAR: return op_rms_linear(c);
    case MVM_OP_RMS_LINEAR_ROPE: return op_rms_linear_rope(c);
    case MVM_OP_RMS_LINEAR_AMAX:
    case MVM_OP_RMS_LINEAR_KV: return op_rms_linear_kv(c);
    case MVM_OP_RMS_GLU: return op_rms_glu(c);
    case MVM_OP_LINEAR_RESIDUAL: return op_linear_residual(c);
    case MVM_OP_ATTN_PARTIAL: return op_attn_partial(c);
    case MVM_OP_ATTN_COMBINE: return op_attn_combine(c);
    case MVM_OP_RMS_LINEAR_ARGMAX: return op_rms_linear_argmax(c);
    case MVM_OP_ARGMAX: return op_argmax(c);
    case MVM_OP_RMSNORM: return op_rmsnorm(c);
    case MVM_OP_LINEAR: return op_linear(c);
    case MVM_OP_ADD: return op_add(c);
    case MVM_OP_ROPE: return op_rope(c);
    case MVM_OP_KV_APPEND: return op_kv_append(c);
    case MVM_OP_EMB_GATHER: return op_emb_gather(c);
    case MVM_OP_INTERACT: return op_interact(c);
    case MVM_OP_ROUTE: return op_route(c);
    case MVM_OP_EXPERT_GLU: return op_expert_glu(c);
    case MVM_OP_EXPERT_DOWN: return op_expert_down(c);
    case MVM_OP_SAMPLE: return op_sample(c);
    case MVM_OP_KV_QUANT: return op_kv_quant(c);
    case MVM_OP_LORA_A: return op_lora_a(c);
    default:
      if (c.tid == 0) mvm_fail(c.a, MVM_ERR_BAD_OPCODE, c.block, c.qpos, c.ins, -1, c.ins->opcode, MVM_OP_COUNT);
      return false;
  }
}
