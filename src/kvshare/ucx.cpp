#include "kvshare/ucx.h"

#include <chrono>
#include <cstring>

#ifdef FLASHSEEK_HAVE_UCX
#include <ucp/api/ucp.h>
#endif

namespace flashseek::kvshare {

#ifdef FLASHSEEK_HAVE_UCX

namespace {

using Clock = std::chrono::steady_clock;

Status ucx_error(const char* what, ucs_status_t st) {
  return Status(StatusCode::kUnavailable, fmt::format("ucx: {}: {}", what, ucs_status_string(st)));
}

void on_ep_error(void* arg, ucp_ep_h, ucs_status_t) { *static_cast<bool*>(arg) = true; }

// Progresses until `req` completes or `deadline` passes; frees it. UCS_ERR_TIMED_OUT when the
// deadline passed (the request is still alive then and has been cancelled, not freed).
ucs_status_t wait(ucp_worker_h w, ucs_status_ptr_t req, Clock::time_point deadline) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  while (true) {
    ucp_worker_progress(w);
    const ucs_status_t st = ucp_request_check_status(req);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(req);
      return st;
    }
    if (Clock::now() >= deadline) {
      ucp_request_cancel(w, req);
      return UCS_ERR_TIMED_OUT;
    }
  }
}

// After a cancel: waits (bounded) for the request to be released by the worker.
void reap(ucp_worker_h w, ucs_status_ptr_t req) {
  const auto until = Clock::now() + std::chrono::seconds(2);
  while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < until)
    ucp_worker_progress(w);
  ucp_request_free(req);  // if still in progress, released when it completes
}

// Closes an endpoint (force: without flushing); waits at most timeout_ms for the close.
// Returns whether the close completed (after that UCX no longer calls the error handler).
bool close_ep(ucp_worker_h w, ucp_ep_h ep, bool force, int timeout_ms) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &p);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return true;
  const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < until)
    ucp_worker_progress(w);
  const bool done = ucp_request_check_status(req) != UCS_INPROGRESS;
  ucp_request_free(req);
  return done;
}

}  // namespace

bool ucx_built() { return true; }

Result<std::unique_ptr<UcxNode>> UcxNode::create() {
  std::unique_ptr<UcxNode> n(new UcxNode());
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return ucx_error("reading the configuration", st);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  ucp_context_h ctx = nullptr;
  st = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (st != UCS_OK) return ucx_error("init", st);
  n->context_ = ctx;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h w = nullptr;
  st = ucp_worker_create(ctx, &wp, &w);
  if (st != UCS_OK) return ucx_error("worker", st);
  n->worker_ = w;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(w, &addr, &len);
  if (st != UCS_OK) return ucx_error("worker address", st);
  const auto* b = reinterpret_cast<const uint8_t*>(addr);
  n->address_.assign(b, b + len);
  ucp_worker_release_address(w, addr);
  return n;
}

UcxNode::~UcxNode() {
  while (!peers_.empty()) drop_peer(peers_.begin()->second.get());
  if (worker_) ucp_worker_destroy(static_cast<ucp_worker_h>(worker_));
  if (context_) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

Result<std::shared_ptr<UcxRegion>> UcxNode::map(const void* p, size_t n, UcxAccess access) {
  std::lock_guard lock(mu_);
  auto ctx = static_cast<ucp_context_h>(context_);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_PROT;
  mp.address = const_cast<void*>(p);
  mp.length = n;
  // Without explicit flags ucp_mem_map grants remote write too: a peer holding the rkey could
  // then overwrite a served snapshot. Served blobs are remote-read only; GET destinations are
  // never exposed to peers at all.
  mp.prot = access == UcxAccess::kRemoteRead
                ? UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ
                : UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(ctx, &mp, &memh);
  if (st != UCS_OK) return ucx_error("mem_map", st);
  void* packed = nullptr;
  size_t packed_len = 0;
  st = ucp_rkey_pack(ctx, memh, &packed, &packed_len);
  if (st != UCS_OK) {
    ucp_mem_unmap(ctx, memh);
    return ucx_error("rkey_pack", st);
  }
  std::shared_ptr<UcxRegion> r(new UcxRegion());
  r->node_ = this;
  r->memh_ = memh;
  r->address_ = reinterpret_cast<uint64_t>(p);
  r->size_ = n;
  r->rkey_.assign(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + packed_len);
  ucp_rkey_buffer_release(packed);
  return r;
}

void UcxNode::unmap(void* memh) {
  std::lock_guard lock(mu_);
  ucp_mem_unmap(static_cast<ucp_context_h>(context_), static_cast<ucp_mem_h>(memh));
}

bool UcxNode::progress() {
  std::lock_guard lock(mu_);
  return ucp_worker_progress(static_cast<ucp_worker_h>(worker_)) != 0;
}

Result<UcxNode::Peer*> UcxNode::peer(std::span<const uint8_t> address) {
  std::vector<uint8_t> key(address.begin(), address.end());
  if (auto it = peers_.find(key); it != peers_.end()) {
    if (!it->second->failed) return it->second.get();
    drop_peer(it->second.get());
  }
  if (peers_.size() >= kMaxPeers) drop_peer(peers_.begin()->second.get());
  auto p = std::make_unique<Peer>();
  p->address = key;
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(p->address.data());
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = on_ep_error;
  ep_params.err_handler.arg = &p->failed;
  ucp_ep_h ep = nullptr;
  const ucs_status_t st = ucp_ep_create(static_cast<ucp_worker_h>(worker_), &ep_params, &ep);
  if (st != UCS_OK) return ucx_error("endpoint", st);
  p->ep = ep;
  Peer* raw = p.get();
  peers_[std::move(key)] = std::move(p);
  return raw;
}

void UcxNode::drop_peer(Peer* p) {
  const bool closed =
      close_ep(static_cast<ucp_worker_h>(worker_), static_cast<ucp_ep_h>(p->ep), /*force=*/true, 2000);
  auto it = peers_.find(p->address);
  // A close still in flight may yet report an error through &p->failed: keep that memory.
  if (!closed) (void)it->second.release();
  peers_.erase(it);
}

Status UcxNode::get(std::span<const uint8_t> peer_address, uint64_t remote_address,
                    std::span<const uint8_t> rkey, void* dst, size_t n, int timeout_ms) {
  if (peer_address.empty() || rkey.empty()) return invalid_argument("ucx: empty peer address or rkey");
  FS_ASSIGN_OR_RETURN(auto dst_region, map(dst, n, UcxAccess::kLocal));  // the GET lands here
  std::lock_guard lock(mu_);
  auto w = static_cast<ucp_worker_h>(worker_);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  // Endpoints are kept per peer worker (wire-up costs a few ms); a failed one is replaced.
  FS_ASSIGN_OR_RETURN(Peer * p, peer(peer_address));
  auto ep = static_cast<ucp_ep_h>(p->ep);
  ucp_rkey_h rk = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(ep, rkey.data(), &rk);
  if (st == UCS_OK) {
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    prm.memh = static_cast<ucp_mem_h>(dst_region->memh_);
    ucs_status_ptr_t req = ucp_get_nbx(ep, dst, n, remote_address, rk, &prm);
    st = wait(w, req, deadline);
    if (st == UCS_ERR_TIMED_OUT) {
      // Force-close first: that completes the cancelled GET before dst can be released.
      ucp_rkey_destroy(rk);
      drop_peer(p);
      reap(w, req);
      return Status(StatusCode::kUnavailable,
                    fmt::format("ucx: GET of {} B timed out after {} ms", n, timeout_ms));
    }
    ucp_rkey_destroy(rk);
  }
  const ucs_status_t result = p->failed && st == UCS_OK ? UCS_ERR_ENDPOINT_TIMEOUT : st;
  if (result != UCS_OK) {
    drop_peer(p);
    return ucx_error("GET", result);
  }
  return {};
}

#else  // built without UCX

bool ucx_built() { return false; }
Result<std::unique_ptr<UcxNode>> UcxNode::create() {
  return Status(StatusCode::kUnavailable, "ucx: this build has no UCX (install libucx-dev)");
}
UcxNode::~UcxNode() = default;
Result<std::shared_ptr<UcxRegion>> UcxNode::map(const void*, size_t, UcxAccess) {
  return Status(StatusCode::kUnavailable, "ucx: not built");
}
void UcxNode::unmap(void*) {}
bool UcxNode::progress() { return false; }
Status UcxNode::get(std::span<const uint8_t>, uint64_t, std::span<const uint8_t>, void*, size_t,
                    int) {
  return Status(StatusCode::kUnavailable, "ucx: not built");
}

#endif

UcxRegion::~UcxRegion() {
  if (node_ && memh_) node_->unmap(memh_);
}

}  // namespace flashseek::kvshare
