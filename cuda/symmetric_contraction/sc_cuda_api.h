// Entry point of the CUDA kernels (sc_cuda.cu); the argument struct is the same as the CPU one, with device
// pointers in it (descriptor arrays, indices, tensors all on the GPU).
#pragma once
#include <cstdint>

#include "sc_cpu_api.h"

// op: 0 forward, 1 backward, 2 double backward; stream: a cudaStream_t as an integer.
void sc_cuda_run(int op, bool is_double, const ScArgs& a, std::uintptr_t stream);
