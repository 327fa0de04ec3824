// The weight-fingerprint digest of one 32-bit word (semantics: python/vradix/kernels/reference.py, fingerprint
// section). It has no CUDA or torch dependency, so the tests also compile it as plain C++ and compare it with the
// reference on the host. uint32 arithmetic wraps mod 2^32, which is what the reference's masked int64 arithmetic
// computes. The constants are reference.MIX_MUL, POS_LO, POS_HI and SEEDS.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define VRADIX_FP_INLINE __host__ __device__ __forceinline__
#else
#define VRADIX_FP_INLINE inline
#endif

namespace vradix_fp {

constexpr int kLanes = 4;

VRADIX_FP_INLINE uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21F0AAADu;
  x ^= x >> 15;
  x *= 0x735A2D97u;
  return x ^ (x >> 15);
}

template <uint32_t PosLo, uint32_t PosHi, uint32_t Seed>
VRADIX_FP_INLINE uint32_t lane_hash(uint32_t w, uint32_t lo, uint32_t hi) {
  return mix32(w ^ (lo * PosLo + hi * PosHi + Seed));
}

// acc[l] += mix32(w ^ g_l(pos)) for the word w at position pos (>= 0) of its tensor.
VRADIX_FP_INLINE void digest_word(uint32_t w, int64_t pos, unsigned long long acc[kLanes]) {
  const uint32_t lo = static_cast<uint32_t>(pos), hi = static_cast<uint32_t>(static_cast<uint64_t>(pos) >> 32);
  acc[0] += lane_hash<0x27D4EB2Fu, 0x5BD1E995u, 0x243F6A88u>(w, lo, hi);
  acc[1] += lane_hash<0x165667B1u, 0x1B873593u, 0x85A308D3u>(w, lo, hi);
  acc[2] += lane_hash<0x61C88647u, 0x2545F491u, 0x13198A2Eu>(w, lo, hi);
  acc[3] += lane_hash<0x7FEB352Du, 0x4CF5AD43u, 0x03707344u>(w, lo, hi);
}

}  // namespace vradix_fp
