// The ucx backend: UCP tagged send/receive between processes over the transports UCX picks
// from params.transports (UCX_TLS): tcp, shared memory (posix, sysv, or sm for both), cma.
// Worker addresses are exchanged through the job's store. No native collectives.
//
// UCX matches messages on a 64-bit tag alone, so collie's tag is packed with the sender:
//   [group: 8 bits][seq: low 16 bits][phase: 4][step: 20][sender's world rank: 16]
// Messages pending at the same time are never 65,536 collectives apart, so the sequence
// number's high bits are not needed to tell them apart.
//
// Waiting polls the worker for a few microseconds, then polls and yields the CPU between
// polls for about a millisecond (so that a rank sharing a core with its peer lets the peer
// run, as Open MPI does when oversubscribed), then sleeps on its event file descriptor
// (UCP_FEATURE_WAKEUP), so idle ranks leave the CPU to busy ones. A peer whose endpoint
// fails (a closed TCP connection) fails every request to or from it at once; a stopped
// peer runs into the timeout. UCX's shared-memory transports cannot report a failed peer,
// so with transports without tcp a dead peer also shows as a timeout.
#include <poll.h>
#include <sched.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "collie/plugin.h"
#include "collie/store.h"

namespace collie::ucx {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxRanks = 1 << 16;
constexpr int64_t kMaxGroup = 255;  // group ids 1..255; the world group is 0

uint64_t packTag(uint32_t group, Tag tag, int sender) {
  return (static_cast<uint64_t>(group & 0xFF) << 56) | ((tag & 0xFFFFFFFFFFull) << 16) |
         static_cast<uint64_t>(sender & 0xFFFF);
}

// params.transports ("tcp", "sm", "posix,cma", ...) as UCX_TLS, always with "self".
std::string transportList(const std::string& text) {
  static const std::set<std::string> kKnown = {"tcp", "sm",   "shm",   "posix", "sysv",
                                               "cma", "knem", "xpmem", "self",  "rc",
                                               "ud",  "dc",   "ib",    "all"};
  std::string tls;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    if (!kKnown.count(item)) {
      throw ConfigError("backend ucx: params.transports: unknown transport '" + item +
                        "'; expected a comma-separated list of tcp, sm (posix+sysv), posix, "
                        "sysv, cma, knem, xpmem, rc, ud, dc or all");
    }
    if (item == "shm") item = "sm";
    tls += (tls.empty() ? "" : ",") + item;
  }
  if (tls.empty()) throw ConfigError("backend ucx: params.transports is empty");
  // cma, knem and xpmem only copy large payloads; UCX needs a transport for the rest.
  bool messages = false;
  std::stringstream again(tls);
  while (std::getline(again, item, ',')) {
    messages = messages || !(item == "cma" || item == "knem" || item == "xpmem");
  }
  if (!messages) {
    throw ConfigError("backend ucx: params.transports '" + text +
                      "' has only zero-copy transports, which carry no small messages. HINT: "
                      "pair them with shared memory or tcp, e.g. transports: sysv,cma");
  }
  if (tls != "all" && tls.find("self") == std::string::npos) tls += ",self";
  return tls;
}

// The UCP context, worker and endpoints of one process, shared by its group and sub-groups.
// The worker is created UCS_THREAD_MODE_SERIALIZED: any thread may call into UCX (the
// trainer's communication thread and its main thread both do), one at a time under `mu`,
// which is held for one call or one progress round, never across a wait. abort() only sets
// a flag.
struct Worker {
  std::recursive_mutex mu;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int event_fd = -1;
  std::vector<ucp_ep_h> eps;  // by world rank; null for this rank
  std::map<ucp_ep_h, int> rank_of_ep;
  std::vector<std::string> peer_error;  // by world rank: why its endpoint failed
  int world_rank = 0;
  std::chrono::milliseconds timeout{30000};
  std::string transports;
  std::string rendezvous;  // UCX_RNDV_THRESH to set, "" to leave UCX's
  AbortFlag aborted;
  // Set (under `mu`, with `aborted`) once a request could not be cancelled: a receive that had
  // matched a message still in flight, or a send under way. UCX goes on filling (or reading) its
  // buffer in every later ucp_worker_progress, after the caller has freed or reused it, so this
  // process never progresses the worker again (measured with UCX 1.13: 64 MiB written into a
  // given-up receive's buffer over posix, sysv and tcp; none once progress stops).
  bool given_up = false;
  Store* store = nullptr;  // the job's store (outlives the worker): sub-group ids are agreed here

  ~Worker() {
    for (ucp_ep_h ep : eps) {
      if (ep == nullptr) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
      if (UCS_PTR_IS_PTR(request)) {
        auto deadline = Clock::now() + std::chrono::seconds(1);
        while (!given_up && ucp_request_check_status(request) == UCS_INPROGRESS &&
               Clock::now() < deadline)
          ucp_worker_progress(worker);
        ucp_request_free(request);
      }
    }
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }

  // Progresses until `request` completes, the deadline passes, its peer fails or abort().
  // Returns the final status; on a timeout or failure the request is cancelled first.
  ucs_status_t wait(void* request, int peer, std::chrono::milliseconds timeout, std::string* why) {
    constexpr int kSpins = 64;    // polls before yielding: a shared-memory round trip or two
    constexpr int kYields = 512;  // polls with a yield between them, before sleeping
    const auto deadline = Clock::now() + timeout;
    int idle = 0;
    while (true) {
      std::unique_lock<std::recursive_mutex> lock(mu);
      ucs_status_t status = ucp_request_check_status(request);
      if (status != UCS_INPROGRESS) return status;
      if (!peer_error[peer].empty()) {
        *why = "failed: rank " + std::to_string(peer) +
               "'s connection failed: " + peer_error[peer] + ". HINT: the peer process died";
        return cancel(request);
      }
      if (aborted.isSet()) {
        *why = "failed: aborted: " + aborted.reason();
        return cancel(request);
      }
      if (ucp_worker_progress(worker) != 0) {
        idle = 0;
        continue;
      }
      if (++idle < kSpins) continue;
      if (Clock::now() >= deadline) {
        *why = "timed out after " + std::to_string(timeout.count()) +
               " ms. HINT: the peer never matched it; is it stopped, stuck or running a "
               "different collective?";
        return cancel(request);
      }
      if (idle < kSpins + kYields) {
        lock.unlock();
        sched_yield();
        continue;
      }
      // Nothing moved for a while: sleep until UCX has an event (or 1 ms passes), letting
      // another thread progress meanwhile.
      const bool armed = ucp_worker_arm(worker) == UCS_OK;
      lock.unlock();
      if (armed) {
        pollfd fd{event_fd, POLLIN, 0};
        ::poll(&fd, 1, 1);
      }
    }
  }

  // UCX cancels only a receive that has matched no message yet (at once, in
  // ucp_request_cancel); a send, or a receive whose message is under way, completes only when
  // its data has moved. Such a request is given a second to finish; if it does not, the worker
  // is given up (see `given_up`) before the caller may free the buffer.
  ucs_status_t cancel(void* request) {
    std::lock_guard<std::recursive_mutex> lock(mu);
    ucp_request_cancel(worker, request);
    auto until = Clock::now() + std::chrono::seconds(1);
    while (!given_up && ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < until)
      ucp_worker_progress(worker);
    if (ucp_request_check_status(request) == UCS_INPROGRESS && !given_up) {
      given_up = true;
      aborted.set(
          "a transfer could not be cancelled while its message was under way; UCX would go "
          "on writing into its buffer, so this process stops using UCX");
    }
    return UCS_ERR_CANCELED;
  }
};

void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* w = static_cast<Worker*>(arg);
  auto it = w->rank_of_ep.find(ep);
  if (it != w->rank_of_ep.end()) w->peer_error[it->second] = ucs_status_string(status);
}

// A transfer (TransferInfo: described only when it fails) and its peer's world rank.
struct Transfer {
  TransferInfo info;
  int world_peer;
  bool sending() const { return info.sending; }

  std::string describe() const {
    std::string who = "rank " + std::to_string(info.peer);
    if (world_peer != info.peer) who += " (world rank " + std::to_string(world_peer) + ")";
    return info.describe(who);
  }
};

class UcxRequest : public Request, public PooledAllocation<UcxRequest> {
 public:
  UcxRequest(std::shared_ptr<Worker> worker, void* request, Transfer transfer, size_t bytes)
      : worker_(std::move(worker)), request_(request), transfer_(transfer), bytes_(bytes) {}
  ~UcxRequest() override {
    if (request_ != nullptr) {
      std::lock_guard<std::recursive_mutex> lock(worker_->mu);
      if (ucp_request_check_status(request_) == UCS_INPROGRESS) worker_->cancel(request_);
      ucp_request_free(request_);
    }
  }

  void wait(std::chrono::milliseconds timeout) override {
    if (request_ == nullptr) return;
    std::string why;
    ucs_status_t status = worker_->wait(request_, transfer_.world_peer, timeout, &why);
    ucp_tag_recv_info_t info{};
    const bool is_recv = !transfer_.sending();
    {
      std::lock_guard<std::recursive_mutex> lock(worker_->mu);
      if (status == UCS_OK && is_recv) ucp_tag_recv_request_test(request_, &info);
      ucp_request_free(request_);
    }
    request_ = nullptr;
    if (status == UCS_OK && is_recv && info.length != bytes_) {
      throw CommError("ucx: " + transfer_.describe() + ": the message has " +
                      std::to_string(info.length) + " bytes, the receive expects " +
                      std::to_string(bytes_));
    }
    if (status == UCS_ERR_MESSAGE_TRUNCATED) {
      throw CommError("ucx: " + transfer_.describe() + ": the message is larger than the " +
                      std::to_string(bytes_) + " bytes the receive expects");
    }
    if (status != UCS_OK) {
      throw CommError("ucx: " + transfer_.describe() + " " +
                      (why.empty() ? std::string("failed: ") + ucs_status_string(status) : why));
    }
  }

  bool test() override {
    if (request_ == nullptr) return true;
    std::lock_guard<std::recursive_mutex> lock(worker_->mu);
    if (worker_->given_up) return true;  // wait() reports it
    ucp_worker_progress(worker_->worker);
    return ucp_request_check_status(request_) != UCS_INPROGRESS;
  }

 private:
  std::shared_ptr<Worker> worker_;
  void* request_;
  Transfer transfer_;
  size_t bytes_;
};

void check(ucs_status_t status, const std::string& what) {
  if (status != UCS_OK) throw CommError("ucx: " + what + ": " + ucs_status_string(status));
}

// params.rendezvous_threshold as UCX_RNDV_THRESH ("" : leave UCX's own). Over TCP alone
// between hosts the default is never: a rendezvous's handshake (ready-to-receive, done)
// travels on the TCP connection that carries the other direction's data and waits behind
// it, so ranks that exchange large messages both ways (a ring step, halving-doubling) ran
// at 0.6 of the link between two lab hosts and at its rate with eager messages (README).
// On one host (the loopback, no queue to wait in) UCX's choice was faster from 16 MiB. A
// UCX_RNDV_THRESH in the environment is left alone unless the param is given.
std::string rendezvousThreshold(const Params& params, const std::string& transports,
                                bool one_host) {
  const std::string value = params.getString("rendezvous_threshold", "");
  if (value == "auto") return "";
  if (value == "inf" || value == "never") return "inf";
  if (!value.empty()) {
    return std::to_string(params.getBytes("rendezvous_threshold", 0, 1, uint64_t{1} << 40));
  }
  if (one_host || std::getenv("UCX_RNDV_THRESH") != nullptr) return "";
  std::stringstream items(transports);
  for (std::string item; std::getline(items, item, ',');) {
    if (item != "tcp" && item != "self") return "";
  }
  return "inf";
}

class UcxBackend : public Backend {
 public:
  explicit UcxBackend(const PluginContext& context) : worker_(std::make_shared<Worker>()) {
    const auto& ctx = context.backend;
    Params& params = *context.params;
    worker_->timeout = params.getDuration("timeout", std::chrono::milliseconds(30000));
    worker_->transports = transportList(params.getString("transports", "tcp"));
    worker_->rendezvous = rendezvousThreshold(params, worker_->transports, ctx.one_host);
    const std::string interface = params.getString("interface", "");
    if (!interface.empty()) requireInterface("backend ucx", interface);
    if (ctx.store == nullptr) {
      throw PluginError(
          "backend ucx needs the job's rendezvous store: it runs one process "
          "per rank (collie run starts them)");
    }
    if (ctx.size > kMaxRanks) {
      throw ConfigError("backend ucx: at most " + std::to_string(kMaxRanks) + " ranks");
    }
    worker_->world_rank = ctx.rank;
    worker_->store = ctx.store;
    for (int r = 0; r < ctx.size; ++r) ranks_.push_back(r);
    rank_ = ctx.rank;
    // One host: TCP over the loopback only (shared memory does not listen at all).
    start(*ctx.store, interface.empty() && ctx.one_host ? "lo" : interface, ctx.size);
  }

  UcxBackend(std::shared_ptr<Worker> worker, std::vector<int> ranks, int rank, uint32_t group)
      : worker_(std::move(worker)), ranks_(std::move(ranks)), rank_(rank), group_(group) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  std::chrono::milliseconds timeout() const override { return worker_->timeout; }
  Capabilities capabilities() const override { return Capabilities{}; }

  std::unique_ptr<Request> isend(int peer, const Buffer& buf, Tag tag) override {
    const Transfer t = transfer(peer, buf, tag, true);
    if (worker_->aborted.isSet()) worker_->aborted.throwIfSet("ucx: " + t.describe());
    ucp_request_param_t param{};
    std::lock_guard<std::recursive_mutex> lock(worker_->mu);
    ucs_status_ptr_t request = ucp_tag_send_nbx(worker_->eps[t.world_peer], buf.data, buf.bytes(),
                                                packTag(group_, tag, worker_->world_rank), &param);
    if (request == nullptr) return std::make_unique<CompletedRequest>();
    if (UCS_PTR_IS_ERR(request)) {
      throw CommError("ucx: " + t.describe() +
                      " failed: " + ucs_status_string(UCS_PTR_STATUS(request)));
    }
    return std::make_unique<UcxRequest>(worker_, request, t, buf.bytes());
  }

  std::unique_ptr<Request> irecv(int peer, const Buffer& buf, Tag tag) override {
    const Transfer t = transfer(peer, buf, tag, false);
    if (worker_->aborted.isSet()) worker_->aborted.throwIfSet("ucx: " + t.describe());
    ucp_request_param_t param{};
    std::lock_guard<std::recursive_mutex> lock(worker_->mu);
    ucs_status_ptr_t request = ucp_tag_recv_nbx(worker_->worker, buf.data, buf.bytes(),
                                                packTag(group_, tag, t.world_peer), ~0ull, &param);
    if (UCS_PTR_IS_ERR(request)) {
      throw CommError("ucx: " + t.describe() +
                      " failed: " + ucs_status_string(UCS_PTR_STATUS(request)));
    }
    return std::make_unique<UcxRequest>(worker_, request, t, buf.bytes());
  }

  // A view of the same worker and endpoints: sub-groups need no new connections. The group
  // id in the tag keeps their messages apart from every other group's: its lowest world rank
  // draws the next id of the job from the store's counter and publishes it under the split's
  // name, which is the same on every member and unique in the job.
  std::unique_ptr<Backend> split(const std::vector<int>& ranks) override {
    const int me = splitPosition(ranks, rank_, "ucx");
    std::vector<int> world;
    for (int r : ranks) world.push_back(ranks_.at(r));
    const std::string key =
        "ucx/group/" + std::to_string(group_) + "/" + splitName(splits_++, world);
    Store& store = *worker_->store;
    if (me == 0) {
      const int64_t id = store.add("ucx/groups", 1);
      if (id > kMaxGroup) {
        throw CommError("ucx: more than " + std::to_string(kMaxGroup) +
                        " sub-groups in one job: UCX tags hold 8 bits of group id");
      }
      const auto bytes = std::to_string(id);
      store.set(key, std::vector<uint8_t>(bytes.begin(), bytes.end()));
    }
    const std::vector<uint8_t> value = store.get(key);
    const uint32_t group =
        static_cast<uint32_t>(std::stoul(std::string(value.begin(), value.end())));
    return std::make_unique<UcxBackend>(worker_, world, me, group);
  }

  void abort(const std::string& reason) override { worker_->aborted.set(reason); }

 private:
  void start(Store& store, const std::string& interface, int size) {
    Worker& w = *worker_;
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "reading the UCX configuration");
    ucs_status_t status = ucp_config_modify(config, "TLS", w.transports.c_str());
    if (status == UCS_OK && !interface.empty()) {
      status = ucp_config_modify(config, "NET_DEVICES", interface.c_str());
    }
    if (status == UCS_OK && !w.rendezvous.empty()) {
      status = ucp_config_modify(config, "RNDV_THRESH", w.rendezvous.c_str());
    }
    if (status != UCS_OK) {
      ucp_config_release(config);
      throw ConfigError("backend ucx: UCX refused TLS=" + w.transports +
                        (interface.empty() ? "" : " NET_DEVICES=" + interface) +
                        (w.rendezvous.empty() ? "" : " RNDV_THRESH=" + w.rendezvous) + ": " +
                        ucs_status_string(status));
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    status = ucp_init(&params, config, &w.context);
    ucp_config_release(config);
    if (status != UCS_OK) {
      throw ConfigError("backend ucx: cannot start UCX with transports '" + w.transports +
                        "': " + ucs_status_string(status) +
                        ". HINT: `ucx_info -d` lists the transports this machine has");
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    check(ucp_worker_create(w.context, &wp, &w.worker), "creating the worker");
    check(ucp_worker_get_efd(w.worker, &w.event_fd), "getting the worker's event fd");

    ucp_address_t* address = nullptr;
    size_t length = 0;
    check(ucp_worker_get_address(w.worker, &address, &length), "getting the worker address");
    const auto* bytes = reinterpret_cast<const uint8_t*>(address);
    store.set("ucx/address/" + std::to_string(rank_), std::vector<uint8_t>(bytes, bytes + length));
    ucp_worker_release_address(w.worker, address);

    w.eps.assign(size, nullptr);
    w.peer_error.assign(size, "");
    for (int r = 0; r < size; ++r) {
      if (r == rank_) continue;
      std::vector<uint8_t> remote = store.get("ucx/address/" + std::to_string(r));
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(remote.data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &onEndpointError;
      ep.err_handler.arg = &w;
      status = ucp_ep_create(w.worker, &ep, &w.eps[r]);
      if (status == UCS_ERR_UNREACHABLE) {
        // UCX's shared-memory transports cannot report a failed peer (no PEER error mode):
        // without tcp, a dead peer shows as a timeout instead of an immediate error.
        ep.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
        status = ucp_ep_create(w.worker, &ep, &w.eps[r]);
      }
      if (status != UCS_OK) {
        throw CommError("ucx: rank " + std::to_string(rank_) + " cannot reach rank " +
                        std::to_string(r) + " over '" + w.transports +
                        "': " + ucs_status_string(status) +
                        ". HINT: the ranks may be on different hosts with a shared-memory "
                        "transport; add tcp to params.transports");
      }
      w.rank_of_ep[w.eps[r]] = r;
    }
    // Endpoints connect lazily; one exchange with each peer makes sure every lane works
    // before the first collective runs.
    for (int r = 0; r < size; ++r) {
      if (r == rank_) continue;
      uint64_t mine = rank_, theirs = 0;
      Buffer out, in;
      out.data = &mine;
      in.data = &theirs;
      out.count = in.count = 1;
      out.dtype = in.dtype = DType::kI64;
      auto recv = irecv(r, in, 0);
      auto send = isend(r, out, 0);
      send->wait(w.timeout);
      recv->wait(w.timeout);
    }
  }

  Transfer transfer(int peer, const Buffer& buf, Tag tag, bool sending) const {
    checkTransfer("ucx", rank_, size(), peer, buf, sending, MemoryKind::kHost);
    return {{rank_, peer, sending, tag}, ranks_[peer]};
  }

  std::shared_ptr<Worker> worker_;
  std::vector<int> ranks_;  // world rank of each rank of this group
  int rank_ = 0;
  uint32_t group_ = 0;
  int splits_ = 0;
};

}  // namespace
}  // namespace collie::ucx

COLLIE_BACKEND_PLUGIN("ucx", "1.0.0",
                      "UCP tagged messages between processes (tcp, shared memory, cma)",
                      collie::ucx::UcxBackend);
