// CPU matrix products for MLX's stored weight forms, float32 activations:
//   y[M, N] = x[M, K] . W[N, K]^T (+ bias)
// with W in bfloat16 / float16, or in MLX's affine 4- / 8-bit layout
// (uint32 words, low bits first; one scale and one bias per `group`
// consecutive values of a row, in the stored float type).
//
// Written for decoding, where M (the tokens of one step) is small and the
// weights stream from memory once per step: every weight is widened to
// float32 in registers and multiplied in float32, so no float32 copy of a
// weight exists and the products are the float32 path's products (only the
// order of the sums differs).  Output rows are split across a small thread
// pool.  C++17 with x86 intrinsics: the build compiles
// it with -march=native and the vector helpers below pick AVX-512, AVX2
// (+F16C, FMA) or plain scalar code for the machine it runs on.
//
// Plain C ABI, loaded with ctypes (mlxcel_trio/native/__init__.py).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// The few vector operations the kernels use, for the widest ISA the build
// targets; L float lanes per vector.
#if defined(__AVX512F__)
constexpr int L = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vset1(float s) { return _mm512_set1_ps(s); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline float vmaxall(vf v) { return _mm512_reduce_max_ps(v); }
inline vf vround(vf v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf vpow2_mul(vf p, vf k) { return _mm512_scalef_ps(p, k); }
inline bool vany_nan(vf v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }
inline vf widen_bf16(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vf widen_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// 2L bf16 weights (one 64-byte line) as two vectors without a lane
// shuffle: the even-indexed values (each the low half of a 32-bit lane,
// shifted up) and the odd ones (the high half, masked).  Products with it
// take x de-interleaved to match (deinterleave_2l below): on the 2-CPU VM
// a bf16 decode step's products went from ~47 to ~43 ms, the shuffle-free
// widening leaving the loop closer to the memory's pace.
inline void split_bf16(const uint16_t* p, vf& even, vf& odd) {
  const __m512i v = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xFFFF0000u))));
}
inline __m512i bytes(const uint8_t* p) {  // L bytes, one per lane
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline vf widen_u8(const uint8_t* p) { return _mm512_cvtepi32_ps(bytes(p)); }
inline void widen_u4(const uint8_t* p, vf& lo, vf& hi) {
  __m512i b = bytes(p);
  lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
  hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}
#elif defined(__AVX2__)
constexpr int L = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
#if defined(__FMA__)
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
#else
inline vf vfma(vf a, vf b, vf c) { return _mm256_add_ps(_mm256_mul_ps(a, b), c); }
#endif
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vset1(float s) { return _mm256_set1_ps(s); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline float vmaxall(vf v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline vf vround(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// p * 2^k for integral k in [-126, 127]: k added to p's exponent field
inline vf vpow2_mul(vf p, vf k) {
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline bool vany_nan(vf v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }
inline float vsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vf widen_bf16(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#if defined(__F16C__)
inline vf widen_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#else
inline vf widen_f16(const uint16_t* p) {
  alignas(32) float f[L];
  for (int i = 0; i < L; ++i) f[i] = float(reinterpret_cast<const _Float16*>(p)[i]);
  return _mm256_load_ps(f);
}
#endif
inline __m256i bytes(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline vf widen_u8(const uint8_t* p) { return _mm256_cvtepi32_ps(bytes(p)); }
inline void widen_u4(const uint8_t* p, vf& lo, vf& hi) {
  __m256i b = bytes(p);
  lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
  hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
#else
constexpr int L = 1;  // scalar: any CPU the compiler targets
using vf = float;
inline vf vzero() { return 0.f; }
inline vf vload(const float* p) { return *p; }
inline void vstore(float* p, vf v) { *p = v; }
inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
inline vf vadd(vf a, vf b) { return a + b; }
inline vf vset1(float s) { return s; }
inline float vsum(vf v) { return v; }
inline vf widen_bf16(const uint16_t* p) {
  uint32_t u = uint32_t(*p) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline vf widen_f16(const uint16_t* p) {
  _Float16 h;
  std::memcpy(&h, p, 2);
  return float(h);
}
inline vf widen_u8(const uint8_t* p) { return float(*p); }
inline void widen_u4(const uint8_t* p, vf& lo, vf& hi) {
  lo = float(*p & 15);
  hi = float(*p >> 4);
}
#endif

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  _Float16 f;
  std::memcpy(&f, &h, 2);
  return float(f);
}

// dtype codes shared with Python: 0 float32, 1 bfloat16, 2 float16
inline float scalar_at(const void* p, int dtype, long i) {
  if (dtype == 1) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  if (dtype == 2) return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Weights stream from memory once per step: the kernels prefetch this many
// bytes ahead of their reads.  On the 2-CPU VM, over a step's worth of the
// bench shape's matrices: 1.5-1.6x the integer affine kernels' throughput,
// and 1.4x the 16-bit ones' (20 -> 28.7 GB/s with two threads, 10.6 -> 15.0
// with one, quiet; an earlier A/B under a load of 9.5 had seen no gain).
#ifndef MLXN_PREFETCH
#define MLXN_PREFETCH 4096
#endif
constexpr long PREFETCH = MLXN_PREFETCH;

inline void prefetch_at(const void* p) {
#if defined(__AVX512F__) || defined(__AVX2__)
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#else
  __builtin_prefetch(p);
#endif
}
inline void prefetch(const void* p) { prefetch_at(static_cast<const char*>(p) + PREFETCH); }

template <bool BF16>
inline vf widen(const uint16_t* p) {
  if constexpr (BF16)
    return widen_bf16(p);
  else
    return widen_f16(p);
}

// log(sum(exp(x))) over n > 0 floats, as mx.logsumexp computes it: NaN
// with a NaN, +inf with a +inf, -inf when every entry is, else with the
// maximum m, m + log(sum(exp(x - m))).  MLX's CPU exp costs
// ~24 ns a value in the wheels built for x86-64 (scalar), so a 151936-token
// vocabulary took ~3.7 ms of every decode step (mlx-lm normalizes the
// logits each step); the vector exp here takes ~0.13 ms.  exp(t) for t <= 0
// as 2^k * p(r), r = t - k ln 2 in [-ln2/2, ln2/2], p the degree-6 Taylor
// polynomial (relative error ~2e-7); t below -87 counts as exp(-87)
// (~1.6e-38, nothing beside the maximum's 1).
#if defined(__AVX512F__) || defined(__AVX2__)
inline vf vexp_neg(vf t) {
  const vf x = vmax(t, vset1(-87.f));
  const vf k = vround(vmul(x, vset1(1.44269504f)));
  vf r = vfma(k, vset1(-0.693145752f), x);
  r = vfma(k, vset1(-1.42860677e-6f), r);
  vf p = vset1(1.f / 720);
  p = vfma(p, r, vset1(1.f / 120));
  p = vfma(p, r, vset1(1.f / 24));
  p = vfma(p, r, vset1(1.f / 6));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.f));
  p = vfma(p, r, vset1(1.f));
  return vpow2_mul(p, k);
}
#endif

float logsumexp_row(const float* x, long n) {
  float m = -INFINITY;
  bool nan = false;
  long i = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
  vf mv = vset1(-INFINITY);
  for (; i + L <= n; i += L) {
    const vf v = vload(x + i);
    nan = nan || vany_nan(v);
    mv = vmax(mv, v);
  }
  m = vmaxall(mv);
#endif
  for (; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    m = std::max(m, x[i]);
  }
  if (nan) return NAN;
  if (std::isinf(m)) return m;   // a +inf entry: +inf; every entry -inf: -inf
  float sum = 0.f;
  i = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
  const vf mm = vset1(m);   // x - m <= 0 from here on
  vf a0 = vzero(), a1 = vzero();
  for (; i + 2 * L <= n; i += 2 * L) {
    a0 = vadd(a0, vexp_neg(vsub(vload(x + i), mm)));
    a1 = vadd(a1, vexp_neg(vsub(vload(x + i + L), mm)));
  }
  sum = vsum(vadd(a0, a1));
#endif
  for (; i < n; ++i) sum += std::exp(x[i] - m);
  return m + std::log(sum);
}

// ---------------------------------------------------------------- thread pool

// Persistent workers: a decode step makes ~200 calls of ~0.1-1 ms, so
// threads are not started per call.  Between two calls of a step the caller
// runs norms, rotations and the activations' rounding (tens of
// microseconds), so a worker spins (with a pause) for SPIN_US before it
// sleeps: waking a sleeping worker costs a futex call and, on a VM, an idle
// vCPU's wake-up, and the caller computes alone until the worker arrives.
// Spinning 4000 loads (a few microseconds) let the worker fall asleep before
// 85 % of a 4-bit step's ~220 calls; at 250 us it sleeps about once a step
// (after the step's last call, while Python builds the next graph), and the
// bench-4bit step went from ~25.8 to ~23.6 ms (medians of 10 interleaved
// runs, 2 threads).
//
// A job is n chunks in as many contiguous runs as threads.  Each thread
// takes the chunks of its own run in order (so its weight stream runs on
// across chunks, the prefetch already ahead), then those left in the
// others' runs, so a worker the OS has not scheduled yet does not hold up
// the others: the caller waits for the chunks to be done, and only for
// workers already inside the job, never for one still asleep.  Against
// one shared counter: a bf16 step's layer products 33.2 -> 32.5 ms.
constexpr int SPIN_US = 250;
constexpr int WAIT_SPIN_US = 30;

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Pool {
 public:
  explicit Pool(int n) {
    runs_ = std::vector<Run>(n);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
    size_ = n;
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return size_; }

  // chunk(i) for every i in [0, n), over the caller and the workers
  void chunks(int n, const std::function<void(int)>& chunk) {
    if (n <= 1 || size_ <= 1) {
      for (int i = 0; i < n; ++i) chunk(i);
      return;
    }
    // One caller at a time owns the workers: the kernels also run on MLX's
    // stream threads (graph.cpp), and two streams may evaluate at once.  A
    // caller that finds them busy computes its chunks alone instead.
    std::unique_lock<std::mutex> own(busy_, std::try_to_lock);
    if (!own.owns_lock()) {
      for (int i = 0; i < n; ++i) chunk(i);
      return;
    }
    job_ = &chunk;
    n_ = n;
    for (int t = 0; t < size_; ++t) {
      runs_[t].end = int(long(n) * (t + 1) / size_);
      runs_[t].next.store(int(long(n) * t / size_));
    }
    done_.store(0);
    active_.store(true);
    {
      std::lock_guard<std::mutex> g(m_);
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    work(0);
    wait_done(n);
    active_.store(false);
    while (users_.load() != 0) {
    }
  }

  // job(i, n) for i in [0, n), each part a chunk
  void run(const std::function<void(int, int)>& job, int n) {
    n = n < size_ ? n : size_;
    chunks(n, [&](int i) { job(i, n); });
  }

 private:
  // thread `self`'s run first, then the others'
  void work(int self) {
    for (int k = 0; k < size_; ++k) {
      Run& r = runs_[(self + k) % size_];
      for (int i; (i = r.next.fetch_add(1)) < r.end;) {
        (*job_)(i);
        if (done_.fetch_add(1) + 1 == n_ && waiting_.load()) {
          std::lock_guard<std::mutex> g(m_);
          done_cv_.notify_one();
        }
      }
    }
  }
  // The caller's wait for the chunks others took.  It spins WAIT_SPIN_US
  // (they are usually microseconds from done), then sleeps: a worker that
  // has not finished by then is most often off its CPU (another thread of
  // the process, such as Python building the next step, preempted it), and
  // a caller that spun on would keep that worker's chunk from finishing on
  // the CPU it holds.  With mlx-lm's pipelined decode on the 2-CPU VM, the
  // bf16 step went from ~54 to ~51 ms, level with an unpipelined one.
  void wait_done(int n) {
    if (done_.load() == n) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(WAIT_SPIN_US);
    for (int spin = 1; done_.load() != n; ++spin) {
      relax();
      if (spin % 64 == 0 && std::chrono::steady_clock::now() > until) {
        std::unique_lock<std::mutex> lk(m_);
        waiting_.store(true);
        done_cv_.wait(lk, [&] { return done_.load() == n; });
        waiting_.store(false);
        return;
      }
    }
  }
  void loop(int self) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g = gen_.load();
      if (g == seen) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(SPIN_US);
        for (int spin = 1; (g = gen_.load()) == seen; ++spin) {
          relax();
          if (spin % 64 == 0 && std::chrono::steady_clock::now() > until) break;
        }
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return gen_.load() != seen; });
        g = gen_.load();
      }
      seen = g;
      if (stop_) return;
      users_.fetch_add(1);          // before looking: the caller waits for users
      if (active_.load() && gen_.load() == g) work(self);
      users_.fetch_sub(1);
    }
  }
  std::vector<std::thread> workers_;
  std::mutex busy_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::atomic<uint64_t> gen_{0};
  struct alignas(64) Run {
    std::atomic<int> next{0};
    int end = 0;
  };
  std::vector<Run> runs_;
  std::atomic<int> done_{0}, users_{0};
  std::atomic<bool> active_{false}, waiting_{false};
  const std::function<void(int)>* job_ = nullptr;
  int n_ = 0;
  int size_ = 1;
  bool stop_ = false;
};

Pool* pool = nullptr;

// rows(n0, n1) over [0, N) in chunks of a multiple of 4 rows (the 4-row
// kernels below), several per thread so that they balance, and none over
// CHUNK_BYTES of weights (row_bytes a row): a large matrix (a vocabulary's
// lm_head) in 16 chunks of ~1 ms would leave a thread waiting that long for
// the last one of a worker another thread of the process preempted.
constexpr long CHUNK_BYTES = 1L << 20;
void parallel_rows(int N, long row_bytes, const std::function<void(int, int)>& rows) {
  const int parts = pool ? pool->size() : 1;
  if (N < 64 || parts <= 1) {
    rows(0, N);
    return;
  }
  int step = (N + 8 * parts - 1) / (8 * parts);
  step = int(std::min<long>(step, CHUNK_BYTES / std::max(1L, row_bytes)));
  step = std::max(16, (step + 3) & ~3);
  const int n = (N + step - 1) / step;
  pool->chunks(n, [&](int i) {
    const int a = i * step, b = std::min(N, a + step);
    if (a < b) rows(a, b);
  });
}

// ---------------------------------------------------------------- 16-bit weights

#if defined(__AVX512F__)
constexpr bool kSplitBf16 = true;
#else
constexpr bool kSplitBf16 = false;
inline void split_bf16(const uint16_t*, vf&, vf&) {}
#endif

// x's M rows with each whole block of 2L values reordered as split_bf16
// reads the weights: the block's even-indexed values, then its odd ones.
// A partial block at the end of a row keeps its order.
void deinterleave_2l(const float* x, int M, int K, float* xd) {
  for (int r = 0; r < M; ++r) {
    const float* s = x + long(r) * K;
    float* d = xd + long(r) * K;
    int k = 0;
    for (; k + 2 * L <= K; k += 2 * L)
      for (int i = 0; i < L; ++i) {
        d[k + i] = s[k + 2 * i];
        d[k + L + i] = s[k + 2 * i + 1];
      }
    for (; k < K; ++k) d[k] = s[k];
  }
}

// s[r] = sum over k in [k0, k1) of x[r][k] w[k] for MR activation rows and
// one weight row wr; the prefetch runs `ahead` bytes past each line read.
// k0 a multiple of 2L; a span ending before K holds whole 2L blocks only.
template <int MR, bool BF16, bool SPLIT>
inline void span_16(const float* x, int K, const uint16_t* wr, int k0, int k1, long ahead,
                    float* s) {
  vf a0[MR], a1[MR];
  for (int r = 0; r < MR; ++r) a0[r] = a1[r] = vzero();
  int k = k0;
  for (; k + 2 * L <= k1; k += 2 * L) {
    prefetch_at(reinterpret_cast<const char*>(wr + k) + ahead);  // one 64-byte line on AVX-512
    vf w0, w1;
    if constexpr (SPLIT) {
      split_bf16(wr + k, w0, w1);
    } else {
      w0 = widen<BF16>(wr + k);
      w1 = widen<BF16>(wr + k + L);
    }
    for (int r = 0; r < MR; ++r) {
      a0[r] = vfma(vload(x + long(r) * K + k), w0, a0[r]);
      a1[r] = vfma(vload(x + long(r) * K + k + L), w1, a1[r]);
    }
  }
  for (; k + L <= k1; k += L) {
    vf w0 = widen<BF16>(wr + k);
    for (int r = 0; r < MR; ++r) a0[r] = vfma(vload(x + long(r) * K + k), w0, a0[r]);
  }
  for (int r = 0; r < MR; ++r) {
    float t = vsum(vadd(a0[r], a1[r]));
    for (int kk = k; kk < k1; ++kk)
      t += x[long(r) * K + kk] * (BF16 ? bf16_to_f32(wr[kk]) : f16_to_f32(wr[kk]));
    s[r] = t;
  }
}

// x's rows are read again for every weight row, so they should stay in L1:
// past X_SPAN_BYTES of them (several rows of a long K: 8 rows of 2048+, 4
// of 3072) the rows' k range is walked in spans that fit, each span over
// all the chunk's weight rows, the products summed into y.  On the 2-CPU
// VM, 28 products of 1024x3072 at 8 rows took 22.0 ms against 13.3 for the
// same bytes as 3072x1024, x then spilling to L2; 15.8 in spans.
constexpr long X_SPAN_BYTES = 32 << 10;

// MR activation rows at once, each weight row read once for all of them.
// SPLIT: bf16 weights read by split_bf16, x de-interleaved to match.
template <int MR, bool BF16, bool SPLIT = false>
void rows_16(const float* x, int K, const uint16_t* w, const float* bias, float* y, int N,
             int n0, int n1) {
  float s[MR];
  const long span = MR == 1 ? K : (X_SPAN_BYTES / (MR * long(sizeof(float)))) & ~long(2 * L - 1);
  if (span >= K) {
    for (int n = n0; n < n1; ++n) {
      span_16<MR, BF16, SPLIT>(x, K, w + long(n) * K, 0, K, PREFETCH, s);
      for (int r = 0; r < MR; ++r) y[long(r) * N + n] = s[r] + (bias ? bias[n] : 0.f);
    }
    return;
  }
  const long ahead = 2L * K * long(sizeof(uint16_t));   // the same span two rows on
  for (int k0 = 0; k0 < K; k0 += int(span)) {
    const int k1 = int(std::min<long>(K, k0 + span));
    for (int n = n0; n < n1; ++n) {
      span_16<MR, BF16, SPLIT>(x, K, w + long(n) * K, k0, k1, ahead, s);
      for (int r = 0; r < MR; ++r) {
        float& out = y[long(r) * N + n];
        out = (k0 ? out : 0.f) + s[r] + (k1 == K && bias ? bias[n] : 0.f);
      }
    }
  }
}

// ---------------------------------------------------------------- blocked products
//
// For a prefill chunk (more than DECODE_ROWS activation rows) the products
// are compute-bound, and the row kernels above, which widen every weight
// once per 4 rows, are not.  Here the tokens run along the vector lanes: x
// is transposed into blocks of TB tokens ([K][TB] each), and a panel of NR
// weight rows is widened (or dequantized) KC values at a time into a small
// float32 block that stays in L1.  Each k then costs TB / L vector loads,
// NR broadcasts from that block and NR * TB / L fused multiply-adds into
// registers: every weight is widened once per call, and no horizontal sums.
// On AVX-512 this runs at ~0.8x of MKL's sgemm on float32 weights for 512
// rows and ahead of it up to ~64 (one thread); the weights stay 16-bit.

constexpr int DECODE_ROWS = 16;   // up to this many rows: the row kernels
constexpr int KC = 256;           // k values per widened block
constexpr int NR = L >= 16 ? 12 : 6;   // weight rows per panel (NR * 2 accumulators)
constexpr int TB = 2 * L;         // tokens per block

// acc[j][p] (panel row j, tokens [pL, pL + L) of the block) over one k block:
// xb the block's [kn][P * L] activations, wb the panel's [NR][KC] weights,
// ct the block's [NR][P * L] sums so far (overwritten when `first`).
template <int P>
inline void block_tile(const float* xb, int kn, const float* wb, float* ct, bool first) {
  vf acc[NR][P];
  for (int j = 0; j < NR; ++j)
    for (int p = 0; p < P; ++p) acc[j][p] = first ? vzero() : vload(ct + (j * P + p) * L);
  for (int kk = 0; kk < kn; ++kk) {
    __builtin_prefetch(xb + (kk + 8) * P * L);
    vf xv[P];
    for (int p = 0; p < P; ++p) xv[p] = vload(xb + (kk * P + p) * L);
    for (int j = 0; j < NR; ++j) {
      const vf wv = vset1(wb[j * KC + kk]);
      for (int p = 0; p < P; ++p) acc[j][p] = vfma(wv, xv[p], acc[j][p]);
    }
  }
  for (int j = 0; j < NR; ++j)
    for (int p = 0; p < P; ++p) vstore(ct + (j * P + p) * L, acc[j][p]);
}

// y = x . W^T (+ bias) for M > DECODE_ROWS.  row(n, kb, kn, out) writes
// weight row n's k values [kb, kb + kn) as float32 into out; a panel's
// rows past N are zeros.
template <class Row>
void gemm_blocked(const float* x, int M, int K, int N, const float* bias, float* y,
                  const Row& row) {
  const int Mp = (M + L - 1) / L * L;   // the last block may be L wide
  // not zeroed: the transpose below writes every value, padding included
  const std::unique_ptr<float[]> xt(new float[size_t(K) * Mp]);
  // block b at token m0 = b * TB, wb wide: xt + K * m0, laid out [K][wb];
  // tokens past M zero.  Split over the pool too: at 512 rows the copy was
  // a few percent of a product on one thread.
  const int blocks = (Mp + TB - 1) / TB;
  auto transpose = [&](int b) {
    const int m0 = b * TB, wb = std::min(TB, Mp - m0);
    float* dst = xt.get() + size_t(K) * m0;
    for (int m = m0; m < m0 + wb; ++m) {
      const float* src = x + size_t(m) * K;
      for (int k = 0; k < K; ++k) dst[size_t(k) * wb + (m - m0)] = m < M ? src[k] : 0.f;
    }
  };
  if (pool && blocks > 1)
    pool->chunks(blocks, transpose);
  else
    for (int b = 0; b < blocks; ++b) transpose(b);
  const int panels = (N + NR - 1) / NR;
  const int parts = pool ? pool->size() : 1;
  const int per = std::max(1, panels / (4 * parts));
  const int jobs = (panels + per - 1) / per;
  // Panels in groups whose sums (NR x Mp floats each) take about CT_BYTES,
  // so that a k block of xt is read from cache by all of a group's panels
  // and a thread's buffers stay small whatever N is.
  constexpr size_t CT_BYTES = 1 << 20;
  const int group = int(std::max<size_t>(1, CT_BYTES / (sizeof(float) * NR * Mp)));
  auto job = [&](int i) {
    thread_local std::vector<float> wbuf, ct;
    const int q1 = std::min(panels, (i + 1) * per);
    for (int g0 = i * per; g0 < q1; g0 += group) {
      const int g1 = std::min(q1, g0 + group);
      wbuf.resize(size_t(NR) * KC);
      ct.resize(size_t(g1 - g0) * NR * Mp);
      for (int kb = 0; kb < K; kb += KC) {
        const int kn = std::min(KC, K - kb);
        for (int q = g0; q < g1; ++q) {
          for (int j = 0; j < NR; ++j) {
            float* out = wbuf.data() + j * KC;
            if (q * NR + j < N)
              row(q * NR + j, kb, kn, out);
            else
              std::fill(out, out + KC, 0.f);
          }
          float* cq = ct.data() + size_t(q - g0) * NR * Mp;
          for (int m0 = 0; m0 < Mp; m0 += TB) {
            const int wb = std::min(TB, Mp - m0);
            const float* xb = xt.get() + size_t(K) * m0 + size_t(kb) * wb;
            if (wb == TB)
              block_tile<2>(xb, kn, wbuf.data(), cq + NR * m0, kb == 0);
            else
              block_tile<1>(xb, kn, wbuf.data(), cq + NR * m0, kb == 0);
          }
        }
      }
      for (int q = g0; q < g1; ++q) {
        const float* cq = ct.data() + size_t(q - g0) * NR * Mp;
        const int n = q * NR, nj = std::min(NR, N - n);
        for (int m = 0; m < M; ++m) {
          const int m0 = m / TB * TB, wb = std::min(TB, Mp - m0);
          const float* c = cq + NR * m0 + (m - m0);
          float* yr = y + long(m) * N + n;
          for (int j = 0; j < nj; ++j) yr[j] = c[j * wb] + (bias ? bias[n + j] : 0.f);
        }
      }
    }
  };
  if (pool && jobs > 1)
    pool->chunks(jobs, job);
  else
    for (int i = 0; i < jobs; ++i) job(i);
}

// Activation rows per pass of the 16-bit row kernels: each pass reads the
// whole weight matrix, so 8 sequences decoding together (8 rows) read it
// once on AVX-512, whose 32 registers hold 8 rows' two accumulators each.
// (4 passes of 4 -> 2 of 8 at 16 rows.)
#if defined(__AVX512F__)
constexpr int ROWS_16 = 8;
#else
constexpr int ROWS_16 = 4;
#endif

template <bool BF16>
void gemm_16(const float* x, int M, int K, const uint16_t* w, int N, const float* bias, float* y) {
  if (M > DECODE_ROWS) {
    gemm_blocked(x, M, K, N, bias, y, [=](int n, int kb, int kn, float* out) {
      const uint16_t* src = w + long(n) * K + kb;
      int i = 0;
      for (; i + L <= kn; i += L) vstore(out + i, widen<BF16>(src + i));
      for (; i < kn; ++i) out[i] = BF16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
    });
    return;
  }
  constexpr bool SPLIT = BF16 && kSplitBf16;
  if constexpr (SPLIT) {
    thread_local std::vector<float> xd;   // the workers read the caller's
    xd.resize(size_t(M) * K);
    deinterleave_2l(x, M, K, xd.data());
    x = xd.data();
  }
  parallel_rows(N, 2L * K, [&](int n0, int n1) {
    for (int m = 0; m < M; m += ROWS_16) {
      const float* xm = x + long(m) * K;
      float* ym = y + long(m) * N;
      switch (std::min(M - m, ROWS_16)) {
        case 1: rows_16<1, BF16, SPLIT>(xm, K, w, bias, ym, N, n0, n1); break;
        case 2: rows_16<2, BF16, SPLIT>(xm, K, w, bias, ym, N, n0, n1); break;
        case 3: rows_16<3, BF16, SPLIT>(xm, K, w, bias, ym, N, n0, n1); break;
        case 4: rows_16<4, BF16, SPLIT>(xm, K, w, bias, ym, N, n0, n1); break;
#if defined(__AVX512F__)
        case 5: rows_16<5, BF16, SPLIT>(xm, K, w, bias, ym, N, n0, n1); break;
        case 6: rows_16<6, BF16, SPLIT>(xm, K, w, bias, ym, N, n0, n1); break;
        case 7: rows_16<7, BF16, SPLIT>(xm, K, w, bias, ym, N, n0, n1); break;
        case 8: rows_16<8, BF16, SPLIT>(xm, K, w, bias, ym, N, n0, n1); break;
#endif
      }
    }
  });
}

// ---------------------------------------------------------------- affine quantized

// Per activation row: x reordered to match the unpacking order of the
// packed weights, and the sum of x over each group (the biases' share:
// sum_k x_k (s q_k + b) = s sum_k x_k q_k + b sum_k x_k).
struct Prepared {
  std::vector<float> xp, gsum;
};

// 4-bit: byte i of a row holds value 2i in its low and 2i+1 in its high
// nibble, so 16 bytes widened to 16 lanes give the even values (& 15) and
// the odd ones (>> 4) of a 32-value block: x is stored in that order.
void prepare(const float* x, int M, int K, int bits, int group, Prepared& p) {
  p.xp.resize(size_t(M) * K);
  p.gsum.resize(size_t(M) * (K / group));
  for (int m = 0; m < M; ++m) {
    const float* xr = x + long(m) * K;
    float* o = p.xp.data() + long(m) * K;
    if (bits == 4) {
      for (int b = 0; b < K; b += 2 * L)
        for (int i = 0; i < L; ++i) {
          o[b + i] = xr[b + 2 * i];
          o[b + L + i] = xr[b + 2 * i + 1];
        }
    } else {
      std::memcpy(o, xr, sizeof(float) * K);
    }
    for (int g = 0; g < K / group; ++g) {
      float s = 0.f;
      for (int k = 0; k < group; ++k) s += xr[g * group + k];
      p.gsum[long(m) * (K / group) + g] = s;
    }
  }
}

// One weight row's scales and biases as float32, once per row (G values),
// so the group loop reads them without a dtype switch.
inline void row_params(const void* scales, const void* biases, int sdtype, long off, int G,
                       float* s, float* b) {
  for (int g = 0; g < G; ++g) {
    s[g] = scalar_at(scales, sdtype, off + g);
    b[g] = scalar_at(biases, sdtype, off + g);
  }
}

// GROUP is a template parameter so the per-group loop is unrolled: the group
// step (one scale multiply per activation row) is most of the cost at small
// groups otherwise.
template <int MR, int BITS, int GROUP>
void rows_q(const Prepared& p, int K, const uint8_t* w, const void* scales, const void* biases,
            int sdtype, const float* bias, float* y, int N, int m0, int n0, int n1) {
  const int G = K / GROUP;
  const long row_bytes = long(K) * BITS / 8;
  const float* xp = p.xp.data() + long(m0) * K;
  const float* gs = p.gsum.data() + long(m0) * G;
  std::vector<float> sb(2 * size_t(G));
  float* srow = sb.data();
  float* brow = srow + G;
  for (int n = n0; n < n1; ++n) {
    const uint8_t* wr = w + n * row_bytes;
    row_params(scales, biases, sdtype, long(n) * G, G, srow, brow);
    vf acc[MR];
    float bsum[MR];
    for (int r = 0; r < MR; ++r) {
      acc[r] = vzero();
      float t = 0.f;
      for (int g = 0; g < G; ++g) t += brow[g] * gs[long(r) * G + g];
      bsum[r] = t;
    }
    for (int g = 0; g < G; ++g) {
      vf t0[MR], t1[MR];
      for (int r = 0; r < MR; ++r) t0[r] = t1[r] = vzero();
      const int k0 = g * GROUP;
#pragma GCC unroll 8
      for (int i = 0; i < GROUP; i += 2 * L) {
        const int k = k0 + i;
        if constexpr (BITS == 4) {
          vf lo, hi;
          widen_u4(wr + k / 2, lo, hi);
          for (int r = 0; r < MR; ++r) {
            t0[r] = vfma(vload(xp + long(r) * K + k), lo, t0[r]);
            t1[r] = vfma(vload(xp + long(r) * K + k + L), hi, t1[r]);
          }
        } else {
          vf q0 = widen_u8(wr + k), q1 = widen_u8(wr + k + L);
          for (int r = 0; r < MR; ++r) {
            t0[r] = vfma(vload(xp + long(r) * K + k), q0, t0[r]);
            t1[r] = vfma(vload(xp + long(r) * K + k + L), q1, t1[r]);
          }
        }
      }
      const vf s = vset1(srow[g]);
      for (int r = 0; r < MR; ++r) acc[r] = vfma(vadd(t0[r], t1[r]), s, acc[r]);
    }
    for (int r = 0; r < MR; ++r)
      y[long(m0 + r) * N + n] = vsum(acc[r]) + bsum[r] + (bias ? bias[n] : 0.f);
  }
}

template <int BITS, int GROUP>
void gemm_q(const float* x, int M, int K, const uint8_t* w, const void* scales,
            const void* biases, int sdtype, int N, const float* bias, float* y) {
  Prepared p;
  prepare(x, M, K, BITS, GROUP, p);
  parallel_rows(N, long(K) * BITS / 8, [&](int n0, int n1) {
    for (int m = 0; m < M; m += 4) {
      switch (M - m) {
        case 1: rows_q<1, BITS, GROUP>(p, K, w, scales, biases, sdtype, bias, y, N, m, n0, n1); break;
        case 2: rows_q<2, BITS, GROUP>(p, K, w, scales, biases, sdtype, bias, y, N, m, n0, n1); break;
        case 3: rows_q<3, BITS, GROUP>(p, K, w, scales, biases, sdtype, bias, y, N, m, n0, n1); break;
        default: rows_q<4, BITS, GROUP>(p, K, w, scales, biases, sdtype, bias, y, N, m, n0, n1); break;
      }
    }
  });
}

template <int BITS>
int gemm_q_group(const float* x, int M, int K, const uint8_t* w, const void* scales,
                 const void* biases, int sdtype, int group, int N, const float* bias, float* y) {
  switch (group) {
    case 32: gemm_q<BITS, 32>(x, M, K, w, scales, biases, sdtype, N, bias, y); return 0;
    case 64: gemm_q<BITS, 64>(x, M, K, w, scales, biases, sdtype, N, bias, y); return 0;
    case 128: gemm_q<BITS, 128>(x, M, K, w, scales, biases, sdtype, N, bias, y); return 0;
    default: return -1;
  }
}

// ---------------------------------------------------------------- affine, integer activations

// The same affine product with the activations rounded to integers, so the
// products are VNNI integer dot products (vpdpbusd: unsigned weight bytes
// times signed activation bytes, summed in int32) instead of widening every
// weight to float32.  Per 32-bit lane of a 64-byte weight vector, with one
// activation scale d per lane's values (8 at 4 bits, 4 at 8 bits) and
// t_k = x_k / d in [-127, 127]:
//   PASSES 1 ("int8"):  t_k ~ h_k = round(t_k),        |t_k - h_k| <= 1/2
//   PASSES 2 ("int16"): t_k ~ h_k + l_k / 256, l_k = round(256 (t_k - h_k))
//                       clamped to [-127, 127],          |error| <= 1/256
// and sum_k s q_k x_k ~= s d (256 sum q h + sum q l) (a second dot product
// over the low bytes, combined exactly in int32).  The biases' share,
// b sum_k x_k, uses the unrounded x.  Neither is the float32 path's product
// (the exact kernels above are), so library.py selects one (mlxn_set_affine).
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define MLXN_VNNI 1

int affine_mode = 0;  // 0 exact, 1 int8, 2 int16 (library.py selects)

// A weight row's 64-byte vector holds CV values: at 4 bits byte i has value
// 2i (low nibble) and 2i+1 (high), so a lane of the low / high nibbles holds
// values 8j, 8j+2, .. / 8j+1, 8j+3, ..: xq stores each chunk's even values,
// then its odd ones (then, at PASSES 2, the same for the low bytes).  At
// 8 bits byte i is value i.
template <int BITS, int PASSES>
struct QX {
  static constexpr int CV = BITS == 4 ? 128 : 64;  // values per 64 weight bytes
  static constexpr int VPL = CV / 16;              // values per lane
  static constexpr int STRIDE = CV * PASSES;       // xq bytes per chunk
  int K = 0, chunks = 0, G = 0, GP = 0;            // G padded to 16
  std::vector<int8_t> xq;                          // [M, chunks * STRIDE]
  std::vector<float> d;                            // [M, chunks * 16]
  std::vector<float> gsum;                         // [M, GP], zero-padded

  void prepare(const float* x, int M, int K_, int group) {
    K = K_;
    chunks = (K + CV - 1) / CV;
    G = K / group;
    GP = (G + 15) / 16 * 16;
    xq.assign(size_t(M) * chunks * STRIDE, 0);
    d.assign(size_t(M) * chunks * 16, 0.f);
    gsum.assign(size_t(M) * GP, 0.f);
    for (int m = 0; m < M; ++m) {
      const float* xr = x + long(m) * K;
      int8_t* q = xq.data() + long(m) * chunks * STRIDE;
      float* dr = d.data() + long(m) * chunks * 16;
      for (int v = 0; v < K; v += VPL) {  // one lane: VPL consecutive values
        float top = 0.f;
        for (int i = 0; i < VPL && v + i < K; ++i) top = std::max(top, std::fabs(xr[v + i]));
        const float inv = top > 0.f ? 127.f / top : 0.f;
        dr[v / VPL] = PASSES == 1 ? top / 127.f : top / 127.f / 256.f;
        for (int i = 0; i < VPL && v + i < K; ++i) {
          const int k = v + i, c = k / CV, j = k - c * CV;
          const int pos = c * STRIDE + (BITS == 4 ? (j & 1) * 64 + j / 2 : j);
          const float t = xr[k] * inv, h = std::nearbyint(t);
          q[pos] = int8_t(h);
          if (PASSES == 2)
            q[pos + CV] = int8_t(std::clamp(std::nearbyint((t - h) * 256.f), -127.f, 127.f));
        }
      }
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
        for (int k = 0; k < group; ++k) s += xr[g * group + k];
        gsum[long(m) * GP + g] = s;
      }
    }
  }
};

// G scales or biases of one weight row as float32 into out (the caller
// zeroes the padding after G).
inline void widen_row(const void* p, int sdtype, long off, int G, float* out) {
  int g = 0;
  if (sdtype == 0) {
    std::memcpy(out, static_cast<const float*>(p) + off, sizeof(float) * G);
    return;
  }
  for (; g + 16 <= G; g += 16)
    _mm512_storeu_ps(out + g, sdtype == 1 ? widen_bf16(static_cast<const uint16_t*>(p) + off + g)
                                          : widen_f16(static_cast<const uint16_t*>(p) + off + g));
  for (; g < G; ++g) out[g] = scalar_at(p, sdtype, off + g);
}

// The scale of each lane of chunk c: one scale per chunk (GROUP >= CV) or
// CV / GROUP of them, lane j taking group j * VPL / GROUP of the chunk's.
template <int CV, int GROUP>
inline __m512 chunk_scales(const float* srow, int c) {
  if constexpr (GROUP >= CV) {
    return _mm512_set1_ps(srow[c * CV / GROUP]);
  } else {
    constexpr int VPL = CV / 16;
    alignas(64) static const int idx[16] = {
        0 * VPL / GROUP,  1 * VPL / GROUP,  2 * VPL / GROUP,  3 * VPL / GROUP,
        4 * VPL / GROUP,  5 * VPL / GROUP,  6 * VPL / GROUP,  7 * VPL / GROUP,
        8 * VPL / GROUP,  9 * VPL / GROUP,  10 * VPL / GROUP, 11 * VPL / GROUP,
        12 * VPL / GROUP, 13 * VPL / GROUP, 14 * VPL / GROUP, 15 * VPL / GROUP};
    return _mm512_permutexvar_ps(_mm512_load_si512(idx),
                                 _mm512_loadu_ps(srow + c * (CV / GROUP)));
  }
}

// sum over one chunk's CV values of q * (activation bytes at xq), per lane
template <int BITS>
inline __m512i chunk_dot(__m512i lo, __m512i hi, const int8_t* xq) {
  __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
  if constexpr (BITS == 4) a = _mm512_dpbusd_epi32(a, hi, _mm512_loadu_si512(xq + 64));
  return a;
}

template <int MR, int BITS, int GROUP, int PASSES>
void rows_qx(const QX<BITS, PASSES>& p, const uint8_t* w, const void* scales,
             const void* biases, int sdtype, const float* bias, float* y, int N, int m0, int n0,
             int n1) {
  using P = QX<BITS, PASSES>;
  const int G = p.G, GP = p.GP, chunks = p.chunks;
  const long row_bytes = long(p.K) * BITS / 8;
  // the last chunk's bytes may be fewer than 64: a masked load
  const int tail = int(row_bytes - long(chunks - 1) * 64);
  const __mmask64 tmask = tail >= 64 ? ~__mmask64(0) : ((__mmask64(1) << tail) - 1);
  // G scales, then G biases, each padded to GP + 16 (chunk_scales reads 16)
  thread_local std::vector<float> sb;
  sb.assign(2 * size_t(GP + 16), 0.f);
  float* srow = sb.data();
  float* brow = srow + GP + 16;
  const __m512i nib = _mm512_set1_epi8(15);
  for (int n = n0; n < n1; ++n) {
    const uint8_t* wr = w + n * row_bytes;
    widen_row(scales, sdtype, long(n) * G, G, srow);
    widen_row(biases, sdtype, long(n) * G, G, brow);
    __m512 acc[MR];
    for (int r = 0; r < MR; ++r) {  // the biases' share first, on the same accumulator
      const float* gs = p.gsum.data() + long(m0 + r) * GP;
      acc[r] = _mm512_setzero_ps();
      for (int g = 0; g < GP; g += 16)
        acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(brow + g), _mm512_loadu_ps(gs + g), acc[r]);
    }
    for (int c = 0; c < chunks; ++c) {
      prefetch(wr + long(c) * 64);
      const __m512i wv = c + 1 < chunks ? _mm512_loadu_si512(wr + long(c) * 64)
                                        : _mm512_maskz_loadu_epi8(tmask, wr + long(c) * 64);
      const __m512i lo = BITS == 4 ? _mm512_and_si512(wv, nib) : wv;
      const __m512i hi = BITS == 4 ? _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib) : wv;
      const __m512 sv = chunk_scales<P::CV, GROUP>(srow, c);
      for (int r = 0; r < MR; ++r) {
        const int8_t* xq = p.xq.data() + (long(m0 + r) * chunks + c) * P::STRIDE;
        __m512i ai = chunk_dot<BITS>(lo, hi, xq);
        if constexpr (PASSES == 2)
          ai = _mm512_add_epi32(_mm512_slli_epi32(ai, 8), chunk_dot<BITS>(lo, hi, xq + P::CV));
        const __m512 dv = _mm512_loadu_ps(p.d.data() + (long(m0 + r) * chunks + c) * 16);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_mul_ps(sv, dv), acc[r]);
      }
    }
    for (int r = 0; r < MR; ++r)
      y[long(m0 + r) * N + n] = _mm512_reduce_add_ps(acc[r]) + (bias ? bias[n] : 0.f);
  }
}

template <int BITS, int GROUP, int PASSES>
void gemm_qx(const float* x, int M, int K, const uint8_t* w, const void* scales,
             const void* biases, int sdtype, int N, const float* bias, float* y) {
  thread_local QX<BITS, PASSES> prep;
  prep.prepare(x, M, K, GROUP);
  const QX<BITS, PASSES>& p = prep;  // the workers read the caller's thread_local
  parallel_rows(N, long(K) * BITS / 8, [&](int n0, int n1) {
    for (int m = 0; m < M; m += 4) {
      switch (M - m) {
        case 1: rows_qx<1, BITS, GROUP, PASSES>(p, w, scales, biases, sdtype, bias, y, N, m, n0, n1); break;
        case 2: rows_qx<2, BITS, GROUP, PASSES>(p, w, scales, biases, sdtype, bias, y, N, m, n0, n1); break;
        case 3: rows_qx<3, BITS, GROUP, PASSES>(p, w, scales, biases, sdtype, bias, y, N, m, n0, n1); break;
        default: rows_qx<4, BITS, GROUP, PASSES>(p, w, scales, biases, sdtype, bias, y, N, m, n0, n1); break;
      }
    }
  });
}

template <int BITS, int PASSES>
int gemm_qx_group(const float* x, int M, int K, const uint8_t* w, const void* scales,
                  const void* biases, int sdtype, int group, int N, const float* bias, float* y) {
  switch (group) {
    case 32: gemm_qx<BITS, 32, PASSES>(x, M, K, w, scales, biases, sdtype, N, bias, y); return 0;
    case 64: gemm_qx<BITS, 64, PASSES>(x, M, K, w, scales, biases, sdtype, N, bias, y); return 0;
    case 128: gemm_qx<BITS, 128, PASSES>(x, M, K, w, scales, biases, sdtype, N, bias, y); return 0;
    default: return -1;
  }
}
#else
int affine_mode = 0;
#endif

// 32 consecutive values of an affine row (from byte p: 16 bytes at 4 bits,
// 32 at 8), s q + b, into out[0, 32).
template <int BITS>
inline void dequant32(const uint8_t* p, float s, float b, float* out) {
#if defined(__AVX512F__) || defined(__AVX2__)
  const vf vs = vset1(s), vb = vset1(b);
  __m128i v0, v1;   // the 32 values as bytes, in order
  if constexpr (BITS == 4) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(packed, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    v0 = _mm_unpacklo_epi8(lo, hi);
    v1 = _mm_unpackhi_epi8(lo, hi);
  } else {
    v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  }
  alignas(16) uint8_t q[32];
  _mm_store_si128(reinterpret_cast<__m128i*>(q), v0);
  _mm_store_si128(reinterpret_cast<__m128i*>(q + 16), v1);
  for (int i = 0; i < 32; i += L) vstore(out + i, vfma(widen_u8(q + i), vs, vb));
#else
  for (int i = 0; i < 32; ++i) {
    const int qv = BITS == 4 ? (p[i / 2] >> (4 * (i & 1))) & 15 : p[i];
    out[i] = s * float(qv) + b;
  }
#endif
}

// The affine product for M > DECODE_ROWS rows: each panel dequantized to
// float32 (s q + b, unrounded, as mx.quantized_matmul computes it) in every
// mode, the activations unrounded.
template <int BITS>
void affine_blocked(const float* x, int M, int K, const uint8_t* w, const void* scales,
                    const void* biases, int sdtype, int group, int N, const float* bias,
                    float* y) {
  const long row_bytes = long(K) * BITS / 8, groups = K / group;
  gemm_blocked(x, M, K, N, bias, y, [=](int n, int kb, int kn, float* out) {
    const uint8_t* row = w + long(n) * row_bytes;
    for (int i = 0; i < kn; i += 32) {   // K % group == 0, group % 32 == 0
      const int k = kb + i;
      const long g = long(n) * groups + k / group;
      dequant32<BITS>(row + long(k) * BITS / 8, scalar_at(scales, sdtype, g),
                      scalar_at(biases, sdtype, g), out + i);
    }
  });
}

// The affine product in the selected mode (affine_mode); a prefill chunk's
// (M > DECODE_ROWS) exact in every mode.
template <int BITS>
int affine(const float* x, int M, int K, const uint8_t* w, const void* scales, const void* biases,
           int sdtype, int group, int N, const float* bias, float* y) {
  if (M > DECODE_ROWS && (group == 32 || group == 64 || group == 128)) {
    affine_blocked<BITS>(x, M, K, w, scales, biases, sdtype, group, N, bias, y);
    return 0;
  }
#if defined(MLXN_VNNI)
  if (affine_mode == 1)
    return gemm_qx_group<BITS, 1>(x, M, K, w, scales, biases, sdtype, group, N, bias, y);
  if (affine_mode == 2)
    return gemm_qx_group<BITS, 2>(x, M, K, w, scales, biases, sdtype, group, N, bias, y);
#endif
  return gemm_q_group<BITS>(x, M, K, w, scales, biases, sdtype, group, N, bias, y);
}

}  // namespace

extern "C" {

// Bumped when the ABI below changes.
int mlxn_abi() { return 1; }

// The vector ISA this build targets, for the load summary.
const char* mlxn_isa() {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  return "AVX-512 (BF16)";
#elif defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__) && defined(__F16C__)
  return "AVX2+F16C";
#elif defined(__AVX2__)
  return "AVX2";
#elif defined(__ARM_NEON)
  return "NEON";
#else
  return "generic";
#endif
}

// Threads for every later call (1: the caller only).
void mlxn_set_threads(int n) {
  if (pool && pool->size() == n) return;
  delete pool;
  pool = n > 1 ? new Pool(n) : nullptr;
}

// dtype: 1 bfloat16, 2 float16.  bias: float32 [N] or null.  Returns 0, or
// -1 for arguments it does not take.
int mlxn_gemm_16(const float* x, int M, int K, const uint16_t* w, int dtype, int N,
                 const float* bias, float* y) {
  if (M <= 0 || K <= 0 || N <= 0) return -1;
  if (dtype == 1)
    gemm_16<true>(x, M, K, w, N, bias, y);
  else if (dtype == 2)
    gemm_16<false>(x, M, K, w, N, bias, y);
  else
    return -1;
  return 0;
}

// MLX affine layout: w uint32 [N, K * bits / 32]; scales, biases [N, K / group]
// of sdtype (0 float32, 1 bfloat16, 2 float16).  group: 32, 64 or 128.
int mlxn_gemm_affine(const float* x, int M, int K, const uint32_t* w, const void* scales,
                     const void* biases, int sdtype, int bits, int group, int N,
                     const float* bias, float* y) {
  if (M <= 0 || K <= 0 || N <= 0 || group % 32 != 0 || K % group != 0) return -1;
  const uint8_t* wb = reinterpret_cast<const uint8_t*>(w);
  if (bits == 4) return affine<4>(x, M, K, wb, scales, biases, sdtype, group, N, bias, y);
  if (bits == 8) return affine<8>(x, M, K, wb, scales, biases, sdtype, group, N, bias, y);
  return -1;
}

// The affine kernels for later calls: 0 exact float32, 1 int8 / 2 int16
// activations (VNNI); another value changes nothing.  Returns the mode now
// in force: 0 where this build has no VNNI.
int mlxn_set_affine(int mode) {
#if defined(MLXN_VNNI)
  if (mode >= 0 && mode <= 2) affine_mode = mode;
#endif
  return affine_mode;
}

}  // extern "C"
