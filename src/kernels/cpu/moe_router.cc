// CPU MoE routers (noaux_tc; softmax top-k; fp32) and expert sort (kernels/moe_router.h): the naive reference, one token
// at a time, selections by repeated scans in ascending index (a strictly larger value wins, so equal
// values keep the lower index). cuda/moe_router.cu does the same float operations in the same order.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/moe_router.h"

namespace aerie::cpu {

void moe_router_noaux_tc(const float* logits, const float* bias, int64_t t, int64_t e, const MoeRouterConfig& cfg,
                         int32_t* indices, float* weights) {
  const int64_t gsize = e / cfg.n_group, k = cfg.top_k;
  std::vector<float> score(e), choice(e), gscore(cfg.n_group);
  std::vector<char> kept(cfg.n_group), taken(e);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t j = 0; j < e; ++j) {
      score[j] = 1.0f / (1.0f + std::exp(-logits[r * e + j]));
      choice[j] = score[j] + bias[j];
    }
    for (int64_t g = 0; g < cfg.n_group; ++g) {  // sum of the group's two largest choice values
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int64_t j = g * gsize; j < (g + 1) * gsize; ++j) {
        if (choice[j] > m1) {
          m2 = m1;
          m1 = choice[j];
        } else if (choice[j] > m2) {
          m2 = choice[j];
        }
      }
      gscore[g] = m1 + m2;
      kept[g] = 0;
    }
    for (int64_t i = 0; i < cfg.topk_group; ++i) {
      int64_t best = -1;
      for (int64_t g = 0; g < cfg.n_group; ++g)
        if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      if (best >= 0) kept[best] = 1;  // always (topk_group <= n_group, checked)
    }
    for (int64_t j = 0; j < e; ++j) taken[j] = !kept[j / gsize];  // masked groups: never chosen
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      int64_t best = -1;
      for (int64_t j = 0; j < e; ++j)
        if (!taken[j] && (best < 0 || choice[j] > choice[best])) best = j;
      if (best < 0) best = 0;  // never (top_k <= the kept groups' experts, checked)
      taken[best] = 1;
      indices[r * k + i] = static_cast<int32_t>(best);
      weights[r * k + i] = score[best];
      sum += score[best];
    }
    const float den = sum + 1e-20f;
    for (int64_t i = 0; i < k; ++i) {
      float w = weights[r * k + i];
      if (cfg.norm_topk_prob) w /= den;
      weights[r * k + i] = w * cfg.routed_scaling_factor;
    }
  }
}

void moe_router_softmax_topk(const float* logits, int64_t t, int64_t e, const MoeRouterConfig& cfg, int32_t* indices,
                             float* weights) {
  const int64_t k = cfg.top_k;
  std::vector<float> p(e);
  std::vector<char> taken(e);
  for (int64_t r = 0; r < t; ++r) {
    const float* l = logits + r * e;
    float mx = -INFINITY;
    for (int64_t j = 0; j < e; ++j) mx = l[j] > mx ? l[j] : mx;
    float sum = 0.0f;
    for (int64_t j = 0; j < e; ++j) {
      p[j] = std::exp(l[j] - mx);
      sum += p[j];
    }
    for (int64_t j = 0; j < e; ++j) {
      p[j] /= sum;
      taken[j] = 0;
    }
    float picked = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      int64_t best = -1;
      for (int64_t j = 0; j < e; ++j)
        if (!taken[j] && (best < 0 || p[j] > p[best])) best = j;
      taken[best] = 1;
      indices[r * k + i] = static_cast<int32_t>(best);
      weights[r * k + i] = p[best];
      picked += p[best];
    }
    for (int64_t i = 0; i < k; ++i) {
      float w = weights[r * k + i];
      if (cfg.norm_topk_prob) w /= picked;
      weights[r * k + i] = w * cfg.routed_scaling_factor;
    }
  }
}

void moe_sort_by_expert(const int32_t* indices, int64_t pairs, int64_t e, int32_t* counts, int32_t* offsets,
                        int32_t* perm) {
  for (int64_t j = 0; j < e; ++j) counts[j] = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    AERIE_CHECK(indices[p] >= 0 && indices[p] < e, "moe_sort_by_expert: indices[" << p << "] = " << indices[p]
                                                                                  << " is not an expert in [0, "
                                                                                  << e << ")");
    ++counts[indices[p]];
  }
  offsets[0] = 0;
  for (int64_t j = 0; j < e; ++j) offsets[j + 1] = offsets[j] + counts[j];
  std::vector<int32_t> cursor(offsets, offsets + e);
  for (int64_t p = 0; p < pairs; ++p) perm[cursor[indices[p]]++] = static_cast<int32_t>(p);
}

void moe_combine(const float* y, const float* weights, int64_t t, int64_t k, int64_t h, float* out) {
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = 0; j < h; ++j) {
      float acc = 0.0f;
      for (int64_t s = 0; s < k; ++s) acc += weights[r * k + s] * y[(r * k + s) * h + j];
      out[r * h + j] = acc;
    }
}

}  // namespace aerie::cpu
