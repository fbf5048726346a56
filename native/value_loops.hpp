// How the loops over every value of a call (codec, engine) are compiled.
//
// Why: they touch 64 MiB per worker per call, and their byte swaps (the wire is big-endian) only
// vectorize with SSSE3/AVX2, which the x86-64 baseline the extension is built for lacks. A
// function marked INAGG_VALUE_LOOP is built twice on x86-64, for AVX2 and for the baseline, and
// the loader picks the one the CPU runs (GCC/Clang target_clones, an ifunc), so one build is fast
// on new CPUs and still runs on old ones. Elsewhere (other CPUs, a C library without ifuncs)
// the mark is empty. Not FMA: the codec's float64 steps stay separately rounded (they are exact
// anyway, see codec.cpp).
// A macro because an attribute cannot come from a function.
#pragma once

#include <cstddef>  // defines __GLIBC__ where glibc is the C library (its ifuncs are needed)

#if defined(__x86_64__) && defined(__GLIBC__) && (defined(__GNUC__) || defined(__clang__))
#define INAGG_VALUE_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define INAGG_VALUE_LOOP
#endif
