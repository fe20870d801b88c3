// CUDA part of sparsetorch.build_info(): the CUDA library versions this build was compiled against and the
// CUDA targets it compiled (cuda/build_targets.h).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusparse.h>

#include <string>

#include "cuda/build_targets.h"

namespace sparsetorch {

std::string cuda_build_info() {
  std::string list;
  for (const std::string& t : cuda::build_targets()) list += (list.empty() ? "" : ",") + t;
  return "cuda_runtime_compiled=" + std::to_string(CUDART_VERSION) + "\n" +
         "cusparse_compiled=" + std::to_string(CUSPARSE_VERSION) + "\n" +
         "cublas_compiled=" + std::to_string(CUBLAS_VERSION) + "\n" + "cuda_targets=" + list + "\n";
}

}  // namespace sparsetorch
