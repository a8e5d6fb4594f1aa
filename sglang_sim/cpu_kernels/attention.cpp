// The attention of one query over the keys it sees, for every (query, head) of a call: what attention.py's
// decode and extend ops compute. Each sum is one loop in key (or dimension) order, so a token's bits do not
// depend on which other queries share the call: the same in plain decoding, in a speculative verify and in a
// prefill. No -ffast-math: the compiler may not reorder them.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// q [T, H, D], k [S, KVH, D], v [S, KVH, Dv]: float32, contiguous. visible [T, S] bool. sink [H] float32, or
// empty: a per-head logit that joins the softmax's denominator and adds no value. logit_cap > 0 soft-caps.
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor visible, double sm_scale,
                     double logit_cap, torch::Tensor sink) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && k.dtype() == torch::kFloat32 && v.dtype() == torch::kFloat32,
              "attend: float32 q, k and v");
  // held in these locals: a pointer into a temporary's storage would dangle once the temporary is gone
  q = q.contiguous(); k = k.contiguous(); v = v.contiguous(); visible = visible.contiguous(); sink = sink.contiguous();
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), S = k.size(0), KVH = k.size(1), Dv = v.size(2);
  TORCH_CHECK(KVH > 0 && H % KVH == 0 && visible.size(0) == T && visible.size(1) == S, "attend: shapes");
  const int64_t group = H / KVH;
  auto out = torch::zeros({T, H, Dv}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const bool* mp = visible.data_ptr<bool>();
  const bool has_sink = sink.numel() > 0;
  const float* sp = has_sink ? sink.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const float scale = static_cast<float>(sm_scale), cap = static_cast<float>(logit_cap);
  at::parallel_for(0, T * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> score(S);
    std::vector<int64_t> seen(S);
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / H, h = th % H, kvh = h / group;
      const float* qv = qp + (t * H + h) * D;
      int64_t n = 0;
      for (int64_t s = 0; s < S; ++s) {
        if (mp[t * S + s]) seen[n++] = s;
      }
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        const float* kv = kp + (seen[i] * KVH + kvh) * D;
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d) dot += qv[d] * kv[d];
        dot *= scale;
        if (cap > 0) dot = cap * std::tanh(dot / cap);
        score[i] = dot;
        top = std::max(top, dot);
      }
      if (n == 0) continue;  // no keys at all: zero weights, a zero output
      const float sink_logit = has_sink ? sp[h] : 0.f;
      if (has_sink) top = std::max(top, sink_logit);
      float total = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        score[i] = std::exp(score[i] - top);
        total += score[i];
      }
      if (has_sink) total += std::exp(sink_logit - top);
      float* o = op + (t * H + h) * Dv;
      for (int64_t i = 0; i < n; ++i) {
        const float weight = score[i] / total;
        const float* vv = vp + (seen[i] * KVH + kvh) * Dv;
        for (int64_t d = 0; d < Dv; ++d) o[d] += weight * vv[d];
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("attend", &attend); }
