// The optimizers' update rules.
#include "train/optimizer.h"

#include <fmt/format.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>

namespace collie::train {
namespace {

// torch.optim.AdamW: decoupled weight decay, bias-corrected moments, eps outside the sqrt.
class AdamW final : public Optimizer {
 public:
  AdamW(const config::TrainSpec& spec, std::vector<at::Tensor> params)
      : params_(std::move(params)),
        beta1_(spec.beta1),
        beta2_(spec.beta2),
        decay_(spec.weight_decay) {
    for (const auto& p : params_) {
      exp_avg_.push_back(at::zeros_like(p));
      exp_avg_sq_.push_back(at::zeros_like(p));
    }
  }

  void step(double lr) override {
    at::NoGradGuard no_grad;
    ++steps_;
    const double correction1 = 1 - std::pow(beta1_, static_cast<double>(steps_));
    const double correction2 = 1 - std::pow(beta2_, static_cast<double>(steps_));
    for (size_t k = 0; k < params_.size(); ++k) {
      at::Tensor& p = params_[k];
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      p.mul_(1 - lr * decay_);
      exp_avg_[k].mul_(beta1_).add_(g, 1 - beta1_);
      exp_avg_sq_[k].mul_(beta2_).addcmul_(g, g, 1 - beta2_);
      at::Tensor denom = exp_avg_sq_[k].sqrt().div_(std::sqrt(correction2)).add_(kEps);
      p.addcdiv_(exp_avg_[k], denom, -lr / correction1);
    }
  }

  std::vector<std::pair<std::string, at::Tensor>> state() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t k = 0; k < params_.size(); ++k) {
      out.emplace_back(fmt::format("exp_avg/{}", k), exp_avg_[k]);
      out.emplace_back(fmt::format("exp_avg_sq/{}", k), exp_avg_sq_[k]);
    }
    return out;
  }

 private:
  static constexpr double kEps = 1e-8;
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_;
  double beta1_, beta2_, decay_;
};

// torch.optim.SGD with momentum (dampening 0): the buffer starts at zero, so the first
// step's buffer is the gradient, as in PyTorch.
class Sgd final : public Optimizer {
 public:
  Sgd(const config::TrainSpec& spec, std::vector<at::Tensor> params)
      : params_(std::move(params)), momentum_(spec.momentum), decay_(spec.weight_decay) {
    for (const auto& p : params_) buffer_.push_back(at::zeros_like(p));
  }

  void step(double lr) override {
    at::NoGradGuard no_grad;
    ++steps_;
    for (size_t k = 0; k < params_.size(); ++k) {
      at::Tensor& p = params_[k];
      if (!p.grad().defined()) continue;
      at::Tensor g = decay_ != 0 ? p.grad().add(p, decay_) : p.grad();
      if (momentum_ != 0) {
        buffer_[k].mul_(momentum_).add_(g);
        g = buffer_[k];
      }
      p.add_(g, -lr);
    }
  }

  std::vector<std::pair<std::string, at::Tensor>> state() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t k = 0; k < params_.size(); ++k) {
      out.emplace_back(fmt::format("momentum/{}", k), buffer_[k]);
    }
    return out;
  }

 private:
  std::vector<at::Tensor> params_, buffer_;
  double momentum_, decay_;
};

}  // namespace

std::unique_ptr<Optimizer> makeOptimizer(const config::TrainSpec& spec,
                                         std::vector<at::Tensor> params) {
  if (spec.sgd) return std::make_unique<Sgd>(spec, std::move(params));
  return std::make_unique<AdamW>(spec, std::move(params));
}

}  // namespace collie::train
