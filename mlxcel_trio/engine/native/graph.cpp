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
      float* yr = yp + long(r) * D;
      vf a = vzero();
      int k = 0;
      for (; k + L <= D; k += L) a = vfma(vload(xr + k), vload(xr + k), a);
      float ss = vsum(a);
      for (; k < D; ++k) ss += xr[k] * xr[k];
      const float n = 1.f / std::sqrt(ss / float(D) + eps_);
      for (k = 0; k < D; ++k) yr[k] = xr[k] * n * w[k];
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
      const float* c = cs.data() + size_t(r % Lx) * half;
      const float* s = sn.data() + size_t(r % Lx) * half;
      for (int i = 0; i < half; ++i) {
        const int a = traditional_ ? 2 * i : i, b = traditional_ ? 2 * i + 1 : i + half;
        const float x1 = xr[a], x2 = xr[b];
        yr[a] = x1 * c[i] - x2 * s[i];
        yr[b] = x1 * s[i] + x2 * c[i];
      }
      for (int k = dims_; k < D; ++k) yr[k] = xr[k];
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
    const int heads = B * Hq, rep = Hq / Hk;
    auto work = [&](int i, int n) {
      std::vector<float> p(T);
      for (int h = i; h < heads; h += n) {
        const int b = h / Hq, kvh = b * Hk + (h % Hq) / rep;
        const float* qr = qrows[h];
        float top = -INFINITY;
        for (int t = 0; t < T; ++t) {
          const float* kr = krows[long(kvh) * T + t];
          vf a = vzero();
          int d = 0;
          for (; d + L <= D; d += L) a = vfma(vload(qr + d), vload(kr + d), a);
          float sc = vsum(a);
          for (; d < D; ++d) sc += qr[d] * kr[d];
          p[t] = sc * scale_;
          top = std::max(top, p[t]);
        }
        float sum = 0.f;
        for (int t = 0; t < T; ++t) sum += (p[t] = std::exp(p[t] - top));
        const float inv = 1.f / sum;
        float* yr = yp + long(h) * D;
        std::fill(yr, yr + D, 0.f);
        for (int t = 0; t < T; ++t) {
          const float* vr = vrows[long(kvh) * T + t];
          const float w = p[t] * inv;
          int d = 0;
          for (; d + L <= D; d += L) {
#if defined(__AVX512F__) || defined(__AVX2__)
            vf acc = vfma(vset1(w), vload(vr + d), vload(yr + d));
#if defined(__AVX512F__)
            _mm512_storeu_ps(yr + d, acc);
#else
            _mm256_storeu_ps(yr + d, acc);
#endif
#else
            yr[d] += w * vr[d];
#endif
          }
          for (; d < D; ++d) yr[d] += w * vr[d];
        }
      }
    };
    // long contexts: heads split over the pool (a decode step's attention
    // is small otherwise, and the pool's hand-off costs a few microseconds)
    if (pool && long(T) * heads * D >= (1L << 18))
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

int mlxg_abi() { return 2; }

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
