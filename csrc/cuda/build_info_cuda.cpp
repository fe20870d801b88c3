// CUDA part of sparsetorch.build_info(): the CUDA library versions this build was compiled against.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusparse.h>

#include <string>

namespace sparsetorch {

std::string cuda_build_info() {
  return "cuda_runtime_compiled=" + std::to_string(CUDART_VERSION) + "\n" +
         "cusparse_compiled=" + std::to_string(CUSPARSE_VERSION) + "\n" +
         "cublas_compiled=" + std::to_string(CUBLAS_VERSION) + "\n";
}

}  // namespace sparsetorch
