// The element types a kernel launcher accepts, named without torch so that .cu files stay torch-free.
#pragma once

namespace rlk {

enum class DType : int { Float32 = 0, Float64 = 1, Float16 = 2, BFloat16 = 3 };

}  // namespace rlk
