#pragma once
// Per-row parameters of the GPU sampler (kernels_sampling.cu): the backend-neutral TokenSampleParams
// (backend/token_sampling.h), shared by the kernels and the host side without any CUDA header. The same
// layout is copied to device memory as is.
#include "backend/token_sampling.h"

namespace inferx::cuda {

using SampleParams = inferx::TokenSampleParams;
using LogitEdit = inferx::LogitEdit;

}  // namespace inferx::cuda
