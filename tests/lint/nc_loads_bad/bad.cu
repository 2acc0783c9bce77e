// Lint fixture (never compiled): each line breaks one rule of scripts/check_nc_loads.py.
__device__ float f(const float* __restrict__ x) { return __ldg(x); }
__device__ unsigned g(const unsigned* p) { unsigned v; asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p)); return v; }
__device__ float h(const float* x) { return x[0]; }  // __ldg( in a comment is fine
