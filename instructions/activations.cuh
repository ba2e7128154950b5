// Activation functions an epilogue applies, by code (the `act` param). The codes (enum mvm_act, in
// opcodes.cuh) and the torch formulas are in instructions/activations.py.
#pragma once
#include "device.cuh"

__device__ __forceinline__ float activate(int act, float x) {
  switch (act) {
    case ACT_RELU: return fmaxf(x, 0.f);
    case ACT_SIGMOID: return 1.f / (1.f + expf(-x));
    case ACT_SILU: return x / (1.f + expf(-x));
    case ACT_GELU: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case ACT_GELU_TANH: return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    default: return x;
  }
}

// act(gate) * up, with gate clamped above at limit and up to [-limit, limit] when limit > 0.
__device__ __forceinline__ float glu(int act, float gate, float up, float limit) {
  if (limit > 0.f) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
  }
  return activate(act, gate) * up;
}
