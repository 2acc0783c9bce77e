// UCX (ucp) data path for snapshot transfers (issue 6): a node is one ucp context + worker. The
// snapshot owner registers a blob's host memory (ucp_mem_map) and hands the fetcher the blob's
// address, size and packed rkey plus its worker address over the authenticated control channel
// (peer.h); the fetcher creates an endpoint and reads the blob with one one-sided ucp_get_nbx into
// its own registered buffer. With UCX_TLS=tcp (no RDMA) ucp emulates the GET in software, so the
// owner must keep progressing its worker while the fetcher reads (SnapshotServer does, until the
// fetcher reports completion). Every wait is bounded by a deadline; a timed-out GET is cancelled
// and its endpoint force-closed before the destination buffer is released.
//
// Built without UCX (no libucx-dev), create() returns an error and callers use TCP.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/status.h"

namespace flashseek::kvshare {

// True when this build links UCX.
bool ucx_built();

class UcxNode;

// Who may access a registered range: kLocal — only this node (GET destinations); kRemoteRead —
// peers may read it with the packed rkey, never write it (served snapshots).
enum class UcxAccess { kLocal, kRemoteRead };

// A registered memory range; unregistered when the last reference goes.
class UcxRegion {
 public:
  ~UcxRegion();
  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;
  uint64_t address() const { return address_; }
  size_t size() const { return size_; }
  const std::vector<uint8_t>& rkey() const { return rkey_; }  // packed remote key

 private:
  friend class UcxNode;

// Who may access a registered range: kLocal — only this node (GET destinations); kRemoteRead —
// peers may read it with the packed rkey, never write it (served snapshots).
enum class UcxAccess { kLocal, kRemoteRead };
  UcxRegion() = default;
  UcxNode* node_ = nullptr;
  void* memh_ = nullptr;
  uint64_t address_ = 0;
  size_t size_ = 0;
  std::vector<uint8_t> rkey_;
};

class UcxNode {
 public:
  // Reads the UCX configuration from the environment (UCX_TLS, UCX_NET_DEVICES, ...).
  static Result<std::unique_ptr<UcxNode>> create();
  ~UcxNode();
  UcxNode(const UcxNode&) = delete;
  UcxNode& operator=(const UcxNode&) = delete;

  // This worker's address (peers create endpoints from it).
  const std::vector<uint8_t>& address() const { return address_; }
  // Registers [p, p + n) with the given access (protection flags of ucp_mem_map). The node must
  // outlive the region.
  Result<std::shared_ptr<UcxRegion>> map(const void* p, size_t n, UcxAccess access);
  // Drives pending communication once; returns whether anything happened.
  bool progress();
  // One-sided GET of the peer's [remote_address, +n) (registered there, `rkey` packed by it) into
  // dst (n bytes, registered here by this call). Bounded by timeout_ms; on timeout or a peer
  // failure the operation is cancelled, the peer's endpoint closed, and an error returned.
  // Endpoints are kept per peer worker address between calls (at most kMaxPeers).
  Status get(std::span<const uint8_t> peer_address, uint64_t remote_address,
             std::span<const uint8_t> rkey, void* dst, size_t n, int timeout_ms);

 private:
  friend class UcxRegion;
  struct Peer {
    std::vector<uint8_t> address;
    void* ep = nullptr;
    bool failed = false;  // set by UCX's error callback
  };
  static constexpr size_t kMaxPeers = 64;
  UcxNode() = default;
  void unmap(void* memh);
  Result<Peer*> peer(std::span<const uint8_t> address);  // caller holds mu_
  void drop_peer(Peer* p);                               // caller holds mu_

  std::mutex mu_;  // one caller at a time on the worker
  void* context_ = nullptr;
  void* worker_ = nullptr;
  std::vector<uint8_t> address_;
  std::map<std::vector<uint8_t>, std::unique_ptr<Peer>> peers_;
};

}  // namespace flashseek::kvshare
