// The kernels of kernels.cpp as an MLX primitive: y = x . W^T (+ bias) is a
// node of MLX's lazy graph, evaluated on MLX's CPU stream like its own ops.
// Through ctypes alone (kernels.cpp) each product must evaluate its input
// first, so a decode step stops and waits ~4 times per layer and builds no
// graph ahead; as a node, the whole step is one graph and mlx-lm's
// async_eval overlaps building the next step with computing this one.
//
// Built against the installed mlx wheel's headers and libmlx.so (the same
// library Python's mlx loaded).  The arrays come from Python as the
// objects themselves (ctypes.py_object): a Python mx.array is a nanobind
// instance holding an mlx::core::array, found at the offset nanobind stores
// in the instance header.  `mlxg_check` validates that reading on arrays of
// known shapes before anything else is used; the Python side falls back to
// the ctypes path when it fails.

// kernels.cpp comes first, by the build's `-include` (build.py).

#include <cmath>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/scheduler.h"
#include "mlx/stream.h"

namespace mc = mlx::core;

namespace {

// nanobind's instance header (nb_inst): PyObject_HEAD, int32 offset, then
// bit fields: state (2 bits, 2 = ready), direct, internal.
struct Inst {
  intptr_t refcnt;
  void* type;
  int32_t offset;
  uint32_t flags;
};

mc::array* unwrap(void* obj) {
  auto* i = static_cast<Inst*>(obj);
  if ((i->flags & 3u) != 2u) return nullptr;  // not a constructed instance
  char* p = static_cast<char*>(obj) + i->offset;
  bool direct = (i->flags >> 2) & 1u;
  return reinterpret_cast<mc::array*>(direct ? p : *reinterpret_cast<char**>(p));
}

// Gathers a strided float32 array into row-major order.
void gather(const float* src, const mc::Shape& shape, const mc::Strides& strides, float* dst) {
  const int nd = int(shape.size());
  std::vector<int> idx(nd, 0);
  const long total = long(std::accumulate(shape.begin(), shape.end(), 1L,
                                          [](long a, int b) { return a * b; }));
  for (long i = 0; i < total; ++i) {
    long off = 0;
    for (int d = 0; d < nd; ++d) off += long(idx[d]) * strides[d];
    dst[i] = src[off];
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

class NativeGemm : public mc::Primitive {
 public:
  // bits 16: 16-bit weight (wdtype 1 bf16, 2 f16); 4 / 8: affine with
  // scales and biases of sdtype.  Inputs: x, w, [scales, biases], [bias].
  NativeGemm(mc::Stream s, int bits, int wdtype, int sdtype, int group, bool has_bias)
      : mc::Primitive(s), bits_(bits), wdtype_(wdtype), sdtype_(sdtype), group_(group),
        has_bias_(has_bias) {}

  void eval_cpu(const std::vector<mc::array>& in, std::vector<mc::array>& outs) override {
    mc::array& y = outs[0];
    y.set_data(mc::allocator::malloc(y.nbytes()));
    const mc::array& x = in[0];
    auto& enc = mc::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    enc.set_output_array(y);
    const int K = x.shape(-1);
    const int M = int(x.size() / K);
    const int N = y.shape(-1);
    const float* xp = x.data<float>();
    float* xc = nullptr;
    if (!x.flags().row_contiguous) {
      mc::array tmp(x.shape(), mc::float32, nullptr, {});
      tmp.set_data(mc::allocator::malloc(tmp.nbytes()));
      xc = tmp.data<float>();
      enc.add_temporary(tmp);
      enc.dispatch([xp, xc, shape = x.shape(), strides = x.strides()] {
        gather(xp, shape, strides, xc);
      });
      xp = xc;
    }
    const float* bias = has_bias_ ? in.back().data<float>() : nullptr;
    float* yp = y.data<float>();
    if (bits_ == 16) {
      const uint16_t* w = in[1].data<uint16_t>();
      const bool bf16 = wdtype_ == 1;
      enc.dispatch([=] {
        if (bf16)
          gemm_16<true>(xp, M, K, w, N, bias, yp);
        else
          gemm_16<false>(xp, M, K, w, N, bias, yp);
      });
    } else {
      const uint8_t* w = in[1].data<uint8_t>();
      const void* s = in[2].data<void>();
      const void* b = in[3].data<void>();
      const int bits = bits_, group = group_, sdtype = sdtype_;
      enc.dispatch([=] {
        if (bits == 4)
          affine<4>(xp, M, K, w, s, b, sdtype, group, N, bias, yp);
        else
          affine<8>(xp, M, K, w, s, b, sdtype, group, N, bias, yp);
      });
    }
  }

  void eval_gpu(const std::vector<mc::array>&, std::vector<mc::array>&) override {
    throw std::runtime_error("the native kernels run on the CPU only");
  }

  const char* name() const override { return "MlxcelNativeGemm"; }

  bool is_equivalent(const mc::Primitive& other) const override {
    auto& o = static_cast<const NativeGemm&>(other);
    return bits_ == o.bits_ && wdtype_ == o.wdtype_ && sdtype_ == o.sdtype_ &&
           group_ == o.group_ && has_bias_ == o.has_bias_;
  }

 private:
  int bits_, wdtype_, sdtype_, group_;
  bool has_bias_;
};

// ---------------------------------------------------------------- a decode step's other ops
// On the CPU MLX runs mx.fast.rms_norm / rope / scaled_dot_product_attention
// through their generic fallbacks, several primitives each (~0.1-0.7 ms per
// call at decode shapes, most of it per-op overhead): these are each one
// node.  float32 in and out; an input's rows (its last axis) may sit at any
// strides (a transposed or cache-sliced view), the output is row-major.

// Offsets of the rows (every index but the last axis) of an array, in
// row-major order of those indices.
std::vector<long> row_offsets(const mc::array& a) {
  const int nd = int(a.ndim());
  long rows = 1;
  for (int d = 0; d + 1 < nd; ++d) rows *= a.shape(d);
  std::vector<long> out(rows);
  std::vector<int> idx(nd > 1 ? nd - 1 : 0, 0);
  for (long r = 0; r < rows; ++r) {
    long off = 0;
    for (int d = 0; d + 1 < nd; ++d) off += long(idx[d]) * a.strides()[d];
    out[r] = off;
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < a.shape(d)) break;
      idx[d] = 0;
    }
  }
  return out;
}

// An input's rows: its data and each row's offset; gathered row-major first
// when its last axis is not contiguous.
struct Rows {
  const float* p;
  std::vector<long> at;
  std::vector<float> copy;
  explicit Rows(const mc::array& a) {
    if (a.ndim() == 0 || a.shape(-1) == 1 || a.strides().back() == 1) {
      p = a.data<float>();
      at = row_offsets(a);
      return;
    }
    copy.resize(a.size());
    gather(a.data<float>(), a.shape(), a.strides(), copy.data());
    p = copy.data();
    const long D = a.shape(-1), n = long(a.size()) / D;
    at.resize(n);
    for (long r = 0; r < n; ++r) at[r] = r * D;
  }
  const float* operator[](long r) const { return p + at[r]; }
};

// The base of the ops below: the output allocated, the inputs registered,
// then f(inputs, output) on the stream's thread.  f holds its parameters by
// value: the primitive may be released before the task runs.
class RowOp : public mc::Primitive {
 public:
  explicit RowOp(mc::Stream s) : mc::Primitive(s) {}
  void eval_gpu(const std::vector<mc::array>&, std::vector<mc::array>&) override {
    throw std::runtime_error("the native kernels run on the CPU only");
  }

 protected:
  template <class F>
  void dispatch(const std::vector<mc::array>& in, std::vector<mc::array>& outs, F f) {
    mc::array& y = outs[0];
    y.set_data(mc::allocator::malloc(y.nbytes()));
    auto& enc = mc::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    enc.set_output_array(y);
    enc.dispatch([inputs = in, out = y, f]() mutable { f(inputs, out); });
  }
};

// a . b over D floats (the vector lanes, then the tail)
inline float dot(const float* a, const float* b, int D) {
  vf acc = vzero();
  int k = 0;
  for (; k + L <= D; k += L) acc = vfma(vload(a + k), vload(b + k), acc);
  float s = vsum(acc);
  for (; k < D; ++k) s += a[k] * b[k];
  return s;
}

// p[i] = exp(p[i] - top) over n values, all <= top; returns their sum
inline float exp_shifted(float* p, int n, float top) {
  int i = 0;
  float sum = 0.f;
#if defined(__AVX512F__) || defined(__AVX2__)
  const vf t = vset1(top);
  vf acc = vzero();
  for (; i + L <= n; i += L) {
    const vf e = vexp_neg(vsub(vload(p + i), t));
    vstore(p + i, e);
    acc = vadd(acc, e);
  }
  sum = vsum(acc);
#endif
  for (; i < n; ++i) sum += (p[i] = std::exp(p[i] - top));
  return sum;
}

// Decode attention for the nq queries that share one KV head (GQA's rep
// query heads, times the step's tokens): query j attends over key / value
// rows [t0, t1[j]), softmax(q . k * scale) . v into y[j] (D floats each).
// Each key and value row is read from memory once for all nq queries (the
// later ones find it in L1).  krow(t), vrow(t): row t's D floats.  scratch:
// nq * max(t1) floats.
template <class KRow, class VRow>
void attend_group(const float* const* q, float* const* y, const int* t1, int nq, int t0,
                  int D, float scale, KRow krow, VRow vrow, float* scratch) {
  const int tmax = *std::max_element(t1, t1 + nq);
  for (int j = 0; j < nq; ++j) std::fill(y[j], y[j] + D, 0.f);
  if (t0 >= tmax) return;
  const long T = tmax;
  for (int t = t0; t < tmax; ++t) {
    const float* kr = krow(t);
    for (int j = 0; j < nq; ++j)
      if (t < t1[j]) scratch[j * T + t] = dot(q[j], kr, D) * scale;
  }
  for (int j = 0; j < nq; ++j) {
    if (t0 >= t1[j]) continue;
    float* p = scratch + j * T;
    const float top = *std::max_element(p + t0, p + t1[j]);
    const float inv = 1.f / exp_shifted(p + t0, t1[j] - t0, top);
    for (int t = t0; t < t1[j]; ++t) p[t] *= inv;
  }
  for (int t = t0; t < tmax; ++t) {
    const float* vr = vrow(t);
    for (int j = 0; j < nq; ++j) {
      if (t >= t1[j]) continue;
      const float w = scratch[j * T + t];
      float* yr = y[j];
      int d = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
      const vf wv = vset1(w);
      for (; d + L <= D; d += L) vstore(yr + d, vfma(wv, vload(vr + d), vload(yr + d)));
#endif
      for (; d < D; ++d) yr[d] += w * vr[d];
    }
  }
}

// y = x * rsqrt(mean(x^2) + eps) * w over one row of D
void rms_row(const float* x, const float* w, float eps, int D, float* y) {
  const float n = 1.f / std::sqrt(dot(x, x, D) / float(D) + eps);
  for (int k = 0; k < D; ++k) y[k] = x[k] * n * w[k];
}

// x's first 2 * half values rotated in place by the angles' cos c / sin s:
// pairs (2i, 2i + 1) when traditional, else (i, i + half)
void rope_row(float* x, const float* c, const float* s, int half, bool traditional) {
  for (int i = 0; i < half; ++i) {
    const int a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + half;
    const float x1 = x[a], x2 = x[b];
    x[a] = x1 * c[i] - x2 * s[i];
    x[b] = x1 * s[i] + x2 * c[i];
  }
}

// y = x * rsqrt(mean(x^2) + eps) * w over the last axis
class NativeRMSNorm : public RowOp {
 public:
  NativeRMSNorm(mc::Stream s, float eps) : RowOp(s), eps_(eps) {}
  void eval_cpu(const std::vector<mc::array>& in, std::vector<mc::array>& outs) override {
    dispatch(in, outs, [eps = eps_](const std::vector<mc::array>& in, mc::array& y) {
      run(in, y, eps);
    });
  }
  static void run(const std::vector<mc::array>& in, mc::array& y, float eps_) {
    const mc::array& x = in[0];
    const float* w = in[1].data<float>();
    float* yp = y.data<float>();
    const int D = x.shape(-1);
    const Rows rows(x);
    for (size_t r = 0; r < rows.at.size(); ++r) {
      const float* xr = rows[r];
      rms_row(xr, w, eps_, D, yp + long(r) * D);
    }
  }
  const char* name() const override { return "MlxcelNativeRMSNorm"; }
  bool is_equivalent(const mc::Primitive& other) const override {
    auto* o = dynamic_cast<const NativeRMSNorm*>(&other);
    return o && o->eps_ == eps_;
  }

 private:
  float eps_;
};

// mx.logsumexp(x, -1, keepdims=True) per row (kernels.cpp's logsumexp_row):
// mlx-lm normalizes a decode step's logits with it, and MLX's own exp is
// scalar on x86-64.
class NativeLogSumExp : public RowOp {
 public:
  explicit NativeLogSumExp(mc::Stream s) : RowOp(s) {}
  void eval_cpu(const std::vector<mc::array>& in, std::vector<mc::array>& outs) override {
    dispatch(in, outs, [](const std::vector<mc::array>& in, mc::array& y) {
      const Rows rows(in[0]);
      const long D = in[0].shape(-1);
      float* yp = y.data<float>();
      for (size_t r = 0; r < rows.at.size(); ++r) yp[r] = logsumexp_row(rows[r], D);
    });
  }
  const char* name() const override { return "MlxcelNativeLogSumExp"; }
  bool is_equivalent(const mc::Primitive& other) const override {
    return dynamic_cast<const NativeLogSumExp*>(&other) != nullptr;
  }
};

// Rotary embedding of x [..., L, D] at positions offset + l (l along the
// second-to-last axis), frequencies base^(-i / (dims / 2)) as MLX computes
// them; the values past `dims` are copied.
class NativeRoPE : public RowOp {
 public:
  NativeRoPE(mc::Stream s, int dims, bool traditional, float base, float scale, int offset)
      : RowOp(s), dims_(dims), traditional_(traditional), base_(base), scale_(scale),
        offset_(offset) {}
  void eval_cpu(const std::vector<mc::array>& in, std::vector<mc::array>& outs) override {
    dispatch(in, outs, [d = dims_, t = traditional_, b = base_, sc = scale_, o = offset_](
                           const std::vector<mc::array>& in, mc::array& y) {
      run(in, y, d, t, b, sc, o);
    });
  }
  static void run(const std::vector<mc::array>& in, mc::array& y, int dims_, bool traditional_,
                  float base_, float scale_, int offset_) {
    const mc::array& x = in[0];
    float* yp = y.data<float>();
    const int D = x.shape(-1), Lx = x.shape(-2), half = dims_ / 2;
    const Rows rows(x);
    std::vector<float> cs(size_t(Lx) * half), sn(size_t(Lx) * half);
    const float lb = std::log(base_) / float(half);
    for (int l = 0; l < Lx; ++l) {
      const float pos = (float(l) + float(offset_)) * scale_;
      for (int i = 0; i < half; ++i) {
        const float th = pos * std::exp(float(-i) * lb);
        cs[size_t(l) * half + i] = std::cos(th);
        sn[size_t(l) * half + i] = std::sin(th);
      }
    }
    for (size_t r = 0; r < rows.at.size(); ++r) {
      const float* xr = rows[r];
      float* yr = yp + long(r) * D;
      std::copy(xr, xr + D, yr);
      rope_row(yr, cs.data() + size_t(r % Lx) * half, sn.data() + size_t(r % Lx) * half, half,
               traditional_);
    }
  }
  const char* name() const override { return "MlxcelNativeRoPE"; }
  bool is_equivalent(const mc::Primitive& other) const override {
    auto* o = dynamic_cast<const NativeRoPE*>(&other);
    return o && o->dims_ == dims_ && o->traditional_ == traditional_ && o->base_ == base_ &&
           o->scale_ == scale_ && o->offset_ == offset_;
  }

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
  int offset_;
};

// Attention of one query row per head over T cached keys, no mask:
// q [B, Hq, 1, D], k / v [B, Hkv, T, D] (Hq a multiple of Hkv, query head h
// reading kv head h / (Hq / Hkv)); softmax(q k^T scale) v in float32.
class NativeDecodeAttention : public RowOp {
 public:
  NativeDecodeAttention(mc::Stream s, float scale) : RowOp(s), scale_(scale) {}
  void eval_cpu(const std::vector<mc::array>& in, std::vector<mc::array>& outs) override {
    dispatch(in, outs, [sc = scale_](const std::vector<mc::array>& in, mc::array& y) {
      run(in, y, sc);
    });
  }
  static void run(const std::vector<mc::array>& in, mc::array& y, float scale_) {
    const mc::array &q = in[0], &k = in[1], &v = in[2];
    const int B = q.shape(0), Hq = q.shape(1), Hk = k.shape(1), T = k.shape(2), D = q.shape(3);
    const Rows qrows(q), krows(k), vrows(v);
    float* yp = y.data<float>();
    const int rep = Hq / Hk, groups = B * Hk;
    auto work = [&](int i, int n) {
      std::vector<float> p(size_t(rep) * T);
      std::vector<const float*> qs(rep);
      std::vector<float*> ys(rep);
      std::vector<int> t1(rep, T);
      for (int g = i; g < groups; g += n) {   // g: (b, kv head); its queries b * Hq + g % Hk * rep + r
        const int h0 = (g / Hk) * Hq + (g % Hk) * rep;
        for (int r = 0; r < rep; ++r) {
          qs[r] = qrows[h0 + r];
          ys[r] = yp + long(h0 + r) * D;
        }
        attend_group(qs.data(), ys.data(), t1.data(), rep, 0, D, scale_,
                     [&](int t) { return krows[long(g) * T + t]; },
                     [&](int t) { return vrows[long(g) * T + t]; }, p.data());
      }
    };
    // long contexts: heads split over the pool (a decode step's attention
    // is small otherwise, and the pool's hand-off costs a few microseconds)
    if (pool && long(T) * B * Hq * D >= (1L << 18))
      pool->run(work, pool->size());
    else
      work(0, 1);
  }
  const char* name() const override { return "MlxcelNativeDecodeAttention"; }
  bool is_equivalent(const mc::Primitive& other) const override {
    auto* o = dynamic_cast<const NativeDecodeAttention*>(&other);
    return o && o->scale_ == scale_;
  }

 private:
  float scale_;
};

// The output node of one of the ops above; 0, or -1 (nothing changed).
int make_node(void* out, mc::Shape shape, std::shared_ptr<mc::Primitive> prim,
              std::vector<mc::array> inputs) {
  mc::array* y = unwrap(out);
  if (!y) return -1;
  try {
    *y = mc::array(std::move(shape), mc::float32, std::move(prim), std::move(inputs));
  } catch (...) {
    return -1;
  }
  return 0;
}

bool f32(const mc::array* a) { return a && a->dtype() == mc::float32; }

// The kernels read weights in place: evaluated, row-contiguous.
bool stored(const mc::array& a) {
  return a.status() != mc::array::Status::unscheduled && a.flags().row_contiguous;
}

int code(mc::Dtype d) {
  if (d == mc::float32) return 0;
  if (d == mc::bfloat16) return 1;
  if (d == mc::float16) return 2;
  return -1;
}

}  // namespace

extern "C" {

int mlxg_abi() { return 3; }

// 0 when `obj` reads as an array of `shape` (ndim values) and float32.
int mlxg_check(void* obj, const int* shape, int ndim) {
  mc::array* a = unwrap(obj);
  if (a == nullptr || a->ndim() != size_t(ndim) || a->dtype() != mc::float32) return -1;
  for (int i = 0; i < ndim; ++i)
    if (a->shape(i) != shape[i]) return -1;
  return 0;
}

// *out = x . w^T (+ bias) as a graph node.  x: float32 [..., K]; w: bf16 /
// f16 [N, K] (bits 16), or MLX's affine uint32 [N, K * bits / 32] with
// scales / biases [N, K / group]; bias: float32 [N] or null.  Returns 0, or
// -1 for what it does not take (nothing is changed then).
int mlxg_gemm(void* out, void* xo, void* wo, void* so, void* bo, void* biaso, int bits,
              int group) {
  mc::array* y = unwrap(out);
  mc::array* x = unwrap(xo);
  mc::array* w = unwrap(wo);
  if (!y || !x || !w || x->ndim() < 1 || x->dtype() != mc::float32 || w->ndim() != 2) return -1;
  const int K = x->shape(-1);
  const int N = w->shape(0);
  if (K <= 0 || N <= 0 || x->size() == 0 || !stored(*w)) return -1;
  std::vector<mc::array> inputs{*x, *w};
  int wdtype = 0, sdtype = 0;
  if (bits == 16) {
    wdtype = code(w->dtype());
    if ((wdtype != 1 && wdtype != 2) || w->shape(1) != K) return -1;
  } else if (bits == 4 || bits == 8) {
    mc::array* s = unwrap(so);
    mc::array* b = unwrap(bo);
    if (!s || !b || w->dtype() != mc::uint32 || group % 32 != 0 || K % group != 0) return -1;
    if (w->shape(1) != K * bits / 32) return -1;
    sdtype = code(s->dtype());
    if (sdtype < 0 || b->dtype() != s->dtype() || s->ndim() != 2 || b->ndim() != 2 ||
        s->shape(0) != N || s->shape(1) != K / group || b->shape(0) != N ||
        b->shape(1) != K / group)
      return -1;
    if (!stored(*s) || !stored(*b)) return -1;
    inputs.push_back(*s);
    inputs.push_back(*b);
  } else {
    return -1;
  }
  bool has_bias = false;
  if (biaso != nullptr) {
    mc::array* bias = unwrap(biaso);
    if (!bias || bias->dtype() != mc::float32 || bias->ndim() != 1 || bias->shape(0) != N)
      return -1;
    inputs.push_back(*bias);
    has_bias = true;
  }
  mc::Shape shape = x->shape();
  shape.back() = N;
  try {
    mc::Stream s = mc::default_stream(mc::Device::cpu);
    *y = mc::array(std::move(shape), mc::float32,
                   std::make_shared<NativeGemm>(s, bits, wdtype, sdtype, group, has_bias),
                   std::move(inputs));
  } catch (...) {
    return -1;
  }
  return 0;
}

}  // extern "C"

extern "C" {

// *out = mx.fast.rms_norm(x, w, eps) as one node: x float32 [..., D], w float32 [D].
int mlxg_rms_norm(void* out, void* xo, void* wo, float eps) {
  mc::array *x = unwrap(xo), *w = unwrap(wo);
  if (!f32(x) || !f32(w) || x->ndim() < 1 || w->ndim() != 1 || w->shape(0) != x->shape(-1) ||
      x->size() == 0)
    return -1;
  auto s = mc::default_stream(mc::Device::cpu);
  return make_node(out, x->shape(), std::make_shared<NativeRMSNorm>(s, eps), {*x, *w});
}

// *out = mx.logsumexp(x, axis=-1, keepdims=True): x float32 with at least
// one axis and a non-empty last one.
int mlxg_logsumexp(void* out, void* xo) {
  mc::array* x = unwrap(xo);
  if (!f32(x) || x->ndim() < 1 || x->size() == 0) return -1;
  mc::Shape shape = x->shape();
  shape.back() = 1;
  auto s = mc::default_stream(mc::Device::cpu);
  return make_node(out, std::move(shape), std::make_shared<NativeLogSumExp>(s), {*x});
}

// *out = mx.fast.rope(x, dims, traditional, base, scale, offset) for an int
// offset and the default frequencies: x float32 [..., L, D] (3 axes or
// more, as MLX requires), dims even <= D.
int mlxg_rope(void* out, void* xo, int dims, int traditional, float base, float scale,
              int offset) {
  mc::array* x = unwrap(xo);
  if (!f32(x) || x->ndim() < 3 || dims <= 0 || dims % 2 || dims > x->shape(-1) ||
      x->size() == 0 || base <= 0.f)
    return -1;
  auto s = mc::default_stream(mc::Device::cpu);
  return make_node(out, x->shape(),
                   std::make_shared<NativeRoPE>(s, dims, traditional != 0, base, scale, offset),
                   {*x});
}

// *out = softmax(q k^T scale) v for one query row per head, no mask:
// q [B, Hq, 1, D], k / v [B, Hkv, T, D] float32, Hq a multiple of Hkv.
int mlxg_decode_attention(void* out, void* qo, void* ko, void* vo, float scale) {
  mc::array *q = unwrap(qo), *k = unwrap(ko), *v = unwrap(vo);
  if (!f32(q) || !f32(k) || !f32(v) || q->ndim() != 4 || k->ndim() != 4 || v->shape() != k->shape())
    return -1;
  if (q->shape(2) != 1 || q->shape(0) != k->shape(0) || q->shape(3) != k->shape(3) ||
      k->shape(1) == 0 || q->shape(1) % k->shape(1) != 0 || k->shape(2) == 0 || q->size() == 0)
    return -1;
  auto s = mc::default_stream(mc::Device::cpu);
  return make_node(out, q->shape(), std::make_shared<NativeDecodeAttention>(s, scale),
                   {*q, *k, *v});
}

}  // extern "C"

// ---------------------------------------------------------------- a whole decoder layer
// One llama / qwen2 / qwen3 decoder layer for a decode step (a few tokens
// per sequence) as a single node: input RMSNorm, q/k/v projections,
// (Qwen3's per-head q/k RMSNorm), RoPE, the KV cache written in place,
// causal attention over the cache (GQA; per-sequence left padding for a
// batch cache), o projection + residual, post-attention RMSNorm, gate / up,
// SiLU(gate) * up, down projection + residual.  A decode step of MLX nodes
// is ~30 nodes per layer, each with its own dispatch and buffers; here the
// layer is one task on the stream thread that calls the same kernels.
//
// Outputs: the layer's output [B, L, Dm] and the cache's keys / values
// [B, Hk, cap, D] with the new rows written.  The cache buffer is reused
// (donated) when nothing else references the input cache array, as MLX's
// own slice update does; else it is copied first.

namespace {

// kFusedProjs projections in this order: q, k, v, o, gate, up, down.
constexpr int kFusedProjs = 7;

struct FusedProj {
  int bits = 16, wdtype = 1, sdtype = 0, group = 0;
  int w = -1, s = -1, b = -1, bias = -1;  // input indices, -1: absent
};

struct FusedParams {
  int H = 0, Hk = 0, D = 0, dims = 0;
  bool traditional = false, batch = false, qk_norm = false;
  int idx = 0, offset = 0;        // cache write position; RoPE offset (plain cache)
  float eps_in = 0, eps_post = 0, eps_qk = 0, rope_scale = 1, base = 0, scale = 1;
  int ix = 0, in_norm = 1, post_norm = 2, q_norm = -1, k_norm = -1, freqs = -1;
  int keys = 3, values = 4, offsets = -1, lpad = -1;
  FusedProj proj[kFusedProjs];
};

std::atomic<long> fused_nodes{0}, fused_donated{0}, fused_copied{0};

// RoPE's cos / sin for a step's positions: every layer of a step asks for
// the same ones, so the last table is kept (per stream thread).
struct RopeTable {
  std::vector<int> pos;
  std::vector<float> inv;
  float scale = 0;
  std::vector<float> cs, sn;
  const RopeTable& get(const std::vector<int>& p, const std::vector<float>& iv, float sc) {
    if (p == pos && iv == inv && sc == scale && !cs.empty()) return *this;
    pos = p;
    inv = iv;
    scale = sc;
    const size_t half = iv.size();
    cs.resize(p.size() * half);
    sn.resize(p.size() * half);
    for (size_t r = 0; r < p.size(); ++r) {
      const float ps = float(p[r]) * sc;
      for (size_t i = 0; i < half; ++i) {
        const float th = ps * iv[i];
        cs[r * half + i] = std::cos(th);
        sn[r * half + i] = std::sin(th);
      }
    }
    return *this;
  }
};

// An input as the task reads it: raw data and layout only, so a pending
// task holds no reference to the arrays (which would keep MLX from
// donating the cache buffer to the next step).
struct Arr {
  const void* p = nullptr;
  mc::Shape shape;
  mc::Strides strides;
  bool contiguous = false;
  mc::Dtype dtype = mc::float32;
  Arr() = default;
  explicit Arr(const mc::array& a)
      : p(a.data<void>()), shape(a.shape()), strides(a.strides()),
        contiguous(a.flags().row_contiguous), dtype(a.dtype()) {}
  template <class T>
  const T* data() const { return static_cast<const T*>(p); }
  long size() const {
    return std::accumulate(shape.begin(), shape.end(), 1L, [](long a, int b) { return a * b; });
  }
};

// y[M, N] = x[M, K] . W^T (+ bias) for one of the layer's projections
void fused_gemm(const FusedProj& p, const std::vector<Arr>& in, const float* x, int M,
                int K, int N, float* y) {
  const float* bias = p.bias >= 0 ? in[p.bias].data<float>() : nullptr;
  if (p.bits == 16) {
    const uint16_t* w = in[p.w].data<uint16_t>();
    if (p.wdtype == 1)
      gemm_16<true>(x, M, K, w, N, bias, y);
    else
      gemm_16<false>(x, M, K, w, N, bias, y);
  } else {
    const uint8_t* w = in[p.w].data<uint8_t>();
    const void* s = in[p.s].data<void>();
    const void* b = in[p.b].data<void>();
    if (p.bits == 4)
      affine<4>(x, M, K, w, s, b, p.sdtype, p.group, N, bias, y);
    else
      affine<8>(x, M, K, w, s, b, p.sdtype, p.group, N, bias, y);
  }
}

// jobs(i) for i in [0, n) over the pool (the next index taken from its
// shared counter, so uneven jobs balance themselves); small work inline
template <class F>
void parallel_jobs(int n, long work, F jobs) {
  if (!pool || n < 2 || work < (1L << 15)) {
    for (int i = 0; i < n; ++i) jobs(i);
    return;
  }
  pool->chunks(n, [&](int i) { jobs(i); });
}

// Copies a (possibly strided) float32 array into a row-major buffer.
void copy_rowmajor(const Arr& a, float* dst) {
  if (a.contiguous)
    std::memcpy(dst, a.data<float>(), sizeof(float) * a.size());
  else
    gather(a.data<float>(), a.shape, a.strides, dst);
}

// The cache's first `rows` positions into a new buffer [B, H, cap, D].
void copy_cache(const Arr& a, int rows, float* dst) {
  const int B = a.shape[0], H = a.shape[1], cap = a.shape[2], D = a.shape[3];
  const float* src = a.data<float>();
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < rows; ++t) {
        const float* s = src + b * a.strides[0] + h * a.strides[1] + long(t) * a.strides[2];
        float* d = dst + ((long(b) * H + h) * cap + t) * D;
        if (a.strides[3] == 1)
          std::memcpy(d, s, sizeof(float) * D);
        else
          for (int i = 0; i < D; ++i) d[i] = s[i * a.strides[3]];
      }
}

// A shared cache smaller than this is copied rather than waited for: a
// small model's step is shorter than the dispatch the wait leaves idle.
constexpr long WAIT_RATHER_THAN_COPY = 256 * 1024;

class NativeFusedLayer : public mc::Primitive {
 public:
  NativeFusedLayer(mc::Stream s, FusedParams p) : mc::Primitive(s), p_(std::move(p)) {}

  void eval_cpu(const std::vector<mc::array>& in, std::vector<mc::array>& outs) override {
    // Each output holds its own copy of the inputs (make_arrays): drop the
    // siblings' copies now (evaluation detaches them right after) so that
    // the cache arrays count only this node's reference.
    bool tracer = false;
    for (auto& o : outs) tracer = tracer || o.is_tracer();
    if (!tracer)
      for (auto& o : outs)
        if (&o.inputs() != &in) o.inputs().clear();
    outs[0].set_data(mc::allocator::malloc(outs[0].nbytes()));
    bool copy[2] = {false, false};
    for (int j = 0; j < 2; ++j) {
      const mc::array& c = in[j == 0 ? p_.keys : p_.values];
      mc::array& o = outs[1 + j];
      const bool dense = c.flags().row_contiguous && c.data_size() == c.size();
      const long live = long(c.shape(0)) * c.shape(1) * p_.idx * c.shape(3) * sizeof(float);
      if (!tracer && dense && live >= WAIT_RATHER_THAN_COPY && !c.is_donatable() &&
          mc::scheduler::n_active_tasks() > 0) {
        // Pipelined decode (mlx-lm's async_eval): the step before this one
        // may still be running, and MLX holds its buffers, this cache's
        // among them, until it finishes.  Waiting for it costs the stream
        // an idle moment while the nodes after this one are dispatched; a
        // copy costs the cache's live rows, every layer and every step.
        mc::synchronize(stream());
      }
      if (!tracer && dense && c.is_donatable()) {
        o.copy_shared_buffer(c);
        fused_donated.fetch_add(1, std::memory_order_relaxed);
      } else {
        o.set_data(mc::allocator::malloc(o.nbytes()));
        copy[j] = true;
        fused_copied.fetch_add(1, std::memory_order_relaxed);
      }
    }
    fused_nodes.fetch_add(1, std::memory_order_relaxed);
    auto& enc = mc::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    for (auto& o : outs) enc.set_output_array(o);
    std::vector<Arr> args;
    args.reserve(in.size());
    for (auto& a : in) args.emplace_back(a);
    float* out[3] = {outs[0].data<float>(), outs[1].data<float>(), outs[2].data<float>()};
    const int cap = outs[1].shape(2);
    enc.dispatch([args = std::move(args), p = p_, c0 = copy[0], c1 = copy[1], y = out[0],
                  K = out[1], V = out[2], cap] {
      if (c0) copy_cache(args[p.keys], p.idx, K);
      if (c1) copy_cache(args[p.values], p.idx, V);
      run(p, args, y, K, V, cap);
    });
  }

  static void run(const FusedParams& p, const std::vector<Arr>& in, float* y, float* K, float* V,
                  int cap) {
    const Arr& xa = in[p.ix];
    const int B = xa.shape[0], Lq = xa.shape[1], Dm = xa.shape[2], M = B * Lq;
    const int H = p.H, Hk = p.Hk, D = p.D, QN = H * D, KN = Hk * D;
    const int I = in[p.proj[4].w].shape[0];
    thread_local std::vector<float> buf;
    const size_t need = size_t(M) * (3 * size_t(Dm) + 2 * QN + 2 * KN + 2 * size_t(I));
    if (buf.size() < need) buf.resize(need);
    float* x = buf.data();
    float* xn = x + size_t(M) * Dm;
    float* h1 = xn + size_t(M) * Dm;
    float* q = h1 + size_t(M) * Dm;
    float* att = q + size_t(M) * QN;
    float* k = att + size_t(M) * QN;
    float* v = k + size_t(M) * KN;
    float* g = v + size_t(M) * KN;
    float* u = g + size_t(M) * I;
    copy_rowmajor(xa, x);
    const float* w_in = in[p.in_norm].data<float>();
    for (int r = 0; r < M; ++r) rms_row(x + long(r) * Dm, w_in, p.eps_in, Dm, xn + long(r) * Dm);
    fused_gemm(p.proj[0], in, xn, M, Dm, QN, q);
    fused_gemm(p.proj[1], in, xn, M, Dm, KN, k);
    fused_gemm(p.proj[2], in, xn, M, Dm, KN, v);
    if (p.qk_norm) {
      const float* wq = in[p.q_norm].data<float>();
      const float* wk = in[p.k_norm].data<float>();
      for (long r = 0; r < long(M) * H; ++r) rms_row(q + r * D, wq, p.eps_qk, D, q + r * D);
      for (long r = 0; r < long(M) * Hk; ++r) rms_row(k + r * D, wk, p.eps_qk, D, k + r * D);
    }
    // positions: the cache's offset (per sequence for a batch cache) + l
    std::vector<int> pos(M), start(B, 0);
    for (int b = 0; b < B; ++b) {
      int off = p.offset;
      if (p.batch) {
        off = scalar_int(in[p.offsets], b);
        start[b] = std::max(0, scalar_int(in[p.lpad], b));
      }
      for (int l = 0; l < Lq; ++l) pos[b * Lq + l] = off + l;
    }
    const int half = p.dims / 2;
    std::vector<float> inv(half);
    if (p.freqs >= 0) {
      const float* f = in[p.freqs].data<float>();
      for (int i = 0; i < half; ++i) inv[i] = 1.f / f[i];
    } else {
      const float lb = std::log(p.base) / float(half);
      for (int i = 0; i < half; ++i) inv[i] = std::exp(float(-i) * lb);
    }
    thread_local RopeTable table;
    const RopeTable& t = table.get(pos, inv, p.rope_scale);
    for (int r = 0; r < M; ++r) {
      const float* c = t.cs.data() + size_t(r) * half;
      const float* s = t.sn.data() + size_t(r) * half;
      for (int h = 0; h < H; ++h) rope_row(q + (long(r) * H + h) * D, c, s, half, p.traditional);
      for (int h = 0; h < Hk; ++h) rope_row(k + (long(r) * Hk + h) * D, c, s, half, p.traditional);
    }
    // the new rows into the cache at idx + l
    for (int b = 0; b < B; ++b)
      for (int l = 0; l < Lq; ++l)
        for (int h = 0; h < Hk; ++h) {
          const long dst = ((long(b) * Hk + h) * cap + p.idx + l) * D;
          const long src = ((long(b) * Lq + l) * Hk + h) * D;
          std::memcpy(K + dst, k + src, sizeof(float) * D);
          std::memcpy(V + dst, v + src, sizeof(float) * D);
        }
    // attention: query (b, l, h) over positions [start_b, idx + l]
    const int rep = H / Hk, end0 = p.idx + 1;
    const float scale = p.scale;
    parallel_jobs(B * Hk, long(B) * H * (end0 + Lq) * D, [&](int job) {
      const int b = job / Hk, kvh = job % Hk, nq = rep * Lq;
      thread_local std::vector<float> pr;
      thread_local std::vector<const float*> qs;
      thread_local std::vector<float*> ys;
      thread_local std::vector<int> t1;
      pr.resize(size_t(nq) * (end0 + Lq));
      qs.resize(nq);
      ys.resize(nq);
      t1.resize(nq);
      for (int l = 0; l < Lq; ++l)
        for (int r = 0; r < rep; ++r) {
          const long at = ((long(b) * Lq + l) * H + kvh * rep + r) * D;
          qs[l * rep + r] = q + at;
          ys[l * rep + r] = att + at;
          t1[l * rep + r] = p.idx + l + 1;
        }
      const float* Kb = K + (long(b) * Hk + kvh) * cap * D;
      const float* Vb = V + (long(b) * Hk + kvh) * cap * D;
      attend_group(qs.data(), ys.data(), t1.data(), nq, start[b], D, scale,
                   [=](int t) { return Kb + long(t) * D; },
                   [=](int t) { return Vb + long(t) * D; }, pr.data());
    });
    // o projection + residual, post-attention norm, MLP + residual
    fused_gemm(p.proj[3], in, att, M, QN, Dm, h1);
    for (long i = 0; i < long(M) * Dm; ++i) h1[i] += x[i];
    const float* w_post = in[p.post_norm].data<float>();
    for (int r = 0; r < M; ++r)
      rms_row(h1 + long(r) * Dm, w_post, p.eps_post, Dm, xn + long(r) * Dm);
    fused_gemm(p.proj[4], in, xn, M, Dm, I, g);
    fused_gemm(p.proj[5], in, xn, M, Dm, I, u);
    for (long i = 0; i < long(M) * I; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    fused_gemm(p.proj[6], in, g, M, I, Dm, y);
    for (long i = 0; i < long(M) * Dm; ++i) y[i] += h1[i];
  }

  static int scalar_int(const Arr& a, int i) {
    const long off = long(i) * (a.shape.empty() ? 0 : a.strides[0]);
    if (a.dtype == mc::int32) return a.data<int32_t>()[off];
    return int(a.data<int64_t>()[off]);
  }

  void eval_gpu(const std::vector<mc::array>&, std::vector<mc::array>&) override {
    throw std::runtime_error("the native kernels run on the CPU only");
  }
  const char* name() const override { return "MlxcelNativeFusedLayer"; }
  bool is_equivalent(const mc::Primitive&) const override { return false; }

 private:
  FusedParams p_;
};

// y = rows [row0, row0 + rows) of a 16-bit [N, K] weight as float32.  MLX's
// astype runs on one thread and writes the whole float32 copy out to
// memory; layers.py widens a prefill chunk's weights a tile at a time so
// that each tile is still in cache when the BLAS multiplies it.
class NativeWiden : public RowOp {
 public:
  NativeWiden(mc::Stream s, int dtype, long row0) : RowOp(s), dtype_(dtype), row0_(row0) {}
  void eval_cpu(const std::vector<mc::array>& in, std::vector<mc::array>& outs) override {
    dispatch(in, outs, [dtype = dtype_, row0 = row0_](const std::vector<mc::array>& in,
                                                       mc::array& y) {
      const long n = long(y.size());
      const uint16_t* x = in[0].data<uint16_t>() + row0 * y.shape(1);
      float* out = y.data<float>();
      constexpr long kChunk = 1L << 15;   // values per job
      const int jobs = int((n + kChunk - 1) / kChunk);
      parallel_jobs(jobs, n, [&](int j) {
        const long a = j * kChunk, b = std::min(n, a + kChunk);
        long i = a;
        if (dtype == 1)
          for (; i + L <= b; i += L) vstore(out + i, widen<true>(x + i));
        else
          for (; i + L <= b; i += L) vstore(out + i, widen<false>(x + i));
        for (; i < b; ++i) out[i] = scalar_at(x, dtype, i);
      });
    });
  }
  const char* name() const override { return "MlxcelNativeWiden"; }
  bool is_equivalent(const mc::Primitive& other) const override {
    auto* o = dynamic_cast<const NativeWiden*>(&other);
    return o && o->dtype_ == dtype_ && o->row0_ == row0_;
  }

 private:
  int dtype_;
  long row0_;
};

}  // namespace

extern "C" {

// *out = x[row0 : row0 + rows].astype(float32) as one node, for x a stored
// (evaluated, row-contiguous) bfloat16 / float16 matrix [N, K].
int mlxg_widen(void* out, void* xo, int row0, int rows) {
  mc::array* x = unwrap(xo);
  if (!x || (code(x->dtype()) != 1 && code(x->dtype()) != 2) || !stored(*x) || x->ndim() != 2 ||
      row0 < 0 || rows <= 0 || row0 + rows > x->shape(0) || x->shape(1) == 0)
    return -1;
  auto s = mc::default_stream(mc::Device::cpu);
  return make_node(out, {rows, x->shape(1)},
                   std::make_shared<NativeWiden>(s, code(x->dtype()), row0), {*x});
}

// The fused layer (see NativeFusedLayer) as a node.  outs: 3 Python arrays
// replaced by the node's outputs (layer output, keys, values).  arrs:
// kFusedArrays Python arrays or null, in this order: x [B, L, Dm], input
// norm [Dm], post norm [Dm], q norm [D], k norm [D], RoPE freqs [dims / 2]
// (null: `base`), keys, values [B, Hk, cap, D], offsets [B], left padding
// [B] (int32 / int64; batch cache only), then per projection q, k, v, o,
// gate, up, down: weight, scales, biases, bias.  ip: H, Hk, D, dims,
// traditional, idx, offset, batch, then per projection bits, group.  fp:
// eps_in, eps_post, eps_qk, rope scale, base, attention scale.  Returns 0,
// or -1 (nothing changed) for what it does not take.
int mlxg_fused_layer(void** outs, void** arrs, const int* ip, const float* fp) {
  constexpr int kFixed = 10;
  mc::array* a[kFixed + 4 * kFusedProjs];
  for (int i = 0; i < kFixed + 4 * kFusedProjs; ++i) a[i] = arrs[i] ? unwrap(arrs[i]) : nullptr;
  mc::array *x = a[0], *keys = a[6], *values = a[7];
  FusedParams p;
  p.H = ip[0], p.Hk = ip[1], p.D = ip[2], p.dims = ip[3], p.traditional = ip[4] != 0;
  p.idx = ip[5], p.offset = ip[6], p.batch = ip[7] != 0;
  p.eps_in = fp[0], p.eps_post = fp[1], p.eps_qk = fp[2], p.rope_scale = fp[3], p.base = fp[4];
  p.scale = fp[5];
  if (!f32(x) || x->ndim() != 3 || !f32(keys) || !f32(values) || keys->ndim() != 4 ||
      values->shape() != keys->shape())
    return -1;
  const int B = x->shape(0), Lq = x->shape(1), Dm = x->shape(2);
  if (B <= 0 || Lq <= 0 || Dm <= 0 || p.H <= 0 || p.Hk <= 0 || p.H % p.Hk || p.D <= 0 ||
      p.dims <= 0 || p.dims % 2 || p.dims > p.D)
    return -1;
  if (keys->shape(0) != B || keys->shape(1) != p.Hk || keys->shape(3) != p.D || p.idx < 0 ||
      p.idx + Lq > keys->shape(2))
    return -1;
  std::vector<mc::array> inputs;
  auto add = [&](mc::array* arr) {
    inputs.push_back(*arr);
    return int(inputs.size()) - 1;
  };
  auto vec = [&](mc::array* w, int n) { return f32(w) && w->ndim() == 1 && w->shape(0) == n; };
  p.ix = add(x);
  if (!vec(a[1], Dm) || !vec(a[2], Dm)) return -1;
  p.in_norm = add(a[1]);
  p.post_norm = add(a[2]);
  if (a[3] || a[4]) {
    if (!vec(a[3], p.D) || !vec(a[4], p.D)) return -1;
    p.qk_norm = true;
    p.eps_qk = fp[2];
    p.q_norm = add(a[3]);
    p.k_norm = add(a[4]);
  }
  if (a[5]) {
    if (!vec(a[5], p.dims / 2)) return -1;
    p.freqs = add(a[5]);
  } else if (!(p.base > 0.f)) {
    return -1;
  }
  p.keys = add(keys);
  p.values = add(values);
  if (p.batch) {
    for (int j : {8, 9}) {
      mc::array* o = a[j];
      if (!o || o->ndim() != 1 || o->shape(0) != B ||
          (o->dtype() != mc::int32 && o->dtype() != mc::int64))
        return -1;
    }
    p.offsets = add(a[8]);
    p.lpad = add(a[9]);
  }
  // in / out sizes of each projection
  int I = -1;
  const int QN = p.H * p.D, KN = p.Hk * p.D;
  for (int j = 0; j < kFusedProjs; ++j) {
    mc::array** s = a + kFixed + 4 * j;
    FusedProj& pr = p.proj[j];
    pr.bits = ip[8 + 2 * j];
    pr.group = ip[9 + 2 * j];
    mc::array* w = s[0];
    if (!w || w->ndim() != 2 || !stored(*w)) return -1;
    const int N = w->shape(0);
    int K;
    if (pr.bits == 16) {
      pr.wdtype = code(w->dtype());
      if (pr.wdtype != 1 && pr.wdtype != 2) return -1;
      K = w->shape(1);
      pr.w = add(w);
    } else if (pr.bits == 4 || pr.bits == 8) {
      mc::array *sc = s[1], *bi = s[2];
      if (w->dtype() != mc::uint32 || !sc || !bi || pr.group <= 0 || pr.group % 32) return -1;
      K = w->shape(1) * 32 / pr.bits;
      pr.sdtype = code(sc->dtype());
      if (pr.sdtype < 0 || bi->dtype() != sc->dtype() || sc->ndim() != 2 ||
          sc->shape() != bi->shape() || sc->shape(0) != N || K % pr.group ||
          sc->shape(1) != K / pr.group || !stored(*sc) || !stored(*bi))
        return -1;
      pr.w = add(w);
      pr.s = add(sc);
      pr.b = add(bi);
    } else {
      return -1;
    }
    if (s[3]) {
      if (!vec(s[3], N)) return -1;
      pr.bias = add(s[3]);
    }
    // expected (N, K): q (QN, Dm), k / v (KN, Dm), o (Dm, QN), gate / up
    // (I, Dm), down (Dm, I)
    int wantN, wantK;
    switch (j) {
      case 0: wantN = QN, wantK = Dm; break;
      case 1: case 2: wantN = KN, wantK = Dm; break;
      case 3: wantN = Dm, wantK = QN; break;
      case 4: case 5:
        if (I < 0) I = N;
        wantN = I, wantK = Dm;
        break;
      default: wantN = Dm, wantK = I; break;
    }
    if (N != wantN || K != wantK) return -1;
  }
  mc::array *y = unwrap(outs[0]), *ko = unwrap(outs[1]), *vo = unwrap(outs[2]);
  if (!y || !ko || !vo) return -1;
  try {
    auto st = mc::default_stream(mc::Device::cpu);
    auto prim = std::make_shared<NativeFusedLayer>(st, p);
    auto res = mc::array::make_arrays({x->shape(), keys->shape(), values->shape()},
                                      {mc::float32, mc::float32, mc::float32}, prim, inputs);
    *y = res[0];
    *ko = res[1];
    *vo = res[2];
  } catch (...) {
    return -1;
  }
  return 0;
}

// Fused layer nodes evaluated, caches reused in place, caches copied.
void mlxg_fused_counts(long* out) {
  out[0] = fused_nodes.load();
  out[1] = fused_donated.load();
  out[2] = fused_copied.load();
}

}  // extern "C"
