# Writes a C++ source defining `const char kWaitKernelPtx[]` from a PTX file
# (or empty when PTX is unset): cmake -DPTX=file -DOUT=file.cc -P embed_ptx.cmake
set(text "")
if(PTX)
  file(READ "${PTX}" text)
endif()
file(WRITE "${OUT}" "// Generated from src/cuda/wait_kernel.cu by src/cuda/embed_ptx.cmake.\n"
  "namespace shoal::cuda {\nextern const char kWaitKernelPtx[] = R\"shoalptx(${text})shoalptx\";\n}\n")
