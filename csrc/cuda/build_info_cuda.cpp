// CUDA part of sparsetorch.build_info(): library versions compiled against and loaded at run time.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusparse.h>

#include <sstream>
#include <string>

namespace sparsetorch {

std::string cuda_build_info() {
  std::ostringstream s;
  s << "cuda_runtime_compiled=" << CUDART_VERSION << "\n";
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) s << "cuda_runtime=" << runtime << "\n";
  s << "cusparse_compiled=" << CUSPARSE_VERSION << "\n";
  int major = 0, minor = 0, patch = 0;
  if (cusparseGetProperty(MAJOR_VERSION, &major) == CUSPARSE_STATUS_SUCCESS &&
      cusparseGetProperty(MINOR_VERSION, &minor) == CUSPARSE_STATUS_SUCCESS &&
      cusparseGetProperty(PATCH_LEVEL, &patch) == CUSPARSE_STATUS_SUCCESS) {
    s << "cusparse=" << major * 1000 + minor * 100 + patch << "\n";
  }
  s << "cublas_compiled=" << CUBLAS_VERSION << "\n";
  return s.str();
}

}  // namespace sparsetorch
