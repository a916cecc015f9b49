#include "coordinator/message.h"

#include "common/wire.h"

namespace scaleout {

bool Request::SameParams(const Request& o) const {
  if (collective != o.collective || dtype != o.dtype || reduce_op != o.reduce_op ||
      root != o.root || prescale != o.prescale || postscale != o.postscale) {
    return false;
  }
  if (collective == SO_ALLGATHER || collective == SO_ALLTOALL) {
    if (shape.size() != o.shape.size()) return false;
    for (size_t i = 1; i < shape.size(); ++i) {
      if (shape[i] != o.shape[i]) return false;
    }
    return true;
  }
  return shape == o.shape;
}

int64_t Request::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* CollectiveName(int32_t collective) {
  switch (collective) {
#define SO_NAME_CASE_(ENUM, name, code) \
  case SO_##ENUM:                       \
    return #name;
    SO_COLLECTIVE_TABLE(SO_NAME_CASE_)
#undef SO_NAME_CASE_
    default:
      return "unknown collective";
  }
}

namespace {

void PutRequest(WireWriter& w, const Request& r) {
  w.PutString(r.name);
  w.Put<int32_t>(r.collective);
  w.Put<int32_t>(static_cast<int32_t>(r.dtype));
  w.PutVector(r.shape);
  w.Put<int32_t>(static_cast<int32_t>(r.reduce_op));
  w.Put<int32_t>(r.root);
  w.Put<double>(r.prescale);
  w.Put<double>(r.postscale);
  w.Put<int32_t>(r.priority);
}

Request GetRequest(WireReader& rd) {
  Request r;
  r.name = rd.GetString();
  r.collective = rd.Get<int32_t>();
  r.dtype = static_cast<DataType>(rd.Get<int32_t>());
  r.shape = rd.GetVector<int64_t>();
  r.reduce_op = static_cast<ReduceOp>(rd.Get<int32_t>());
  r.root = rd.Get<int32_t>();
  r.prescale = rd.Get<double>();
  r.postscale = rd.Get<double>();
  r.priority = rd.Get<int32_t>();
  return r;
}

}  // namespace

std::vector<uint8_t> EncodeRequests(const RequestMessage& m) {
  WireWriter w;
  w.Put<uint8_t>(static_cast<uint8_t>(MessageType::kRequests));
  w.PutVector(m.cached_slots);
  w.Put<uint32_t>(static_cast<uint32_t>(m.full.size()));
  for (const Request& r : m.full) PutRequest(w, r);
  w.Put<uint8_t>(m.join ? 1 : 0);
  w.Put<int8_t>(m.blocked);
  return w.Take();
}

RequestMessage DecodeRequests(const std::vector<uint8_t>& bytes) {
  WireReader rd(bytes);
  SO_CHECK(rd.Get<uint8_t>() == static_cast<uint8_t>(MessageType::kRequests),
           "not a request message");
  RequestMessage m;
  m.cached_slots = rd.GetVector<int32_t>();
  uint32_t n = rd.Get<uint32_t>();
  m.full.reserve(n);
  for (uint32_t i = 0; i < n; ++i) m.full.push_back(GetRequest(rd));
  m.join = rd.Get<uint8_t>() != 0;
  m.blocked = rd.Get<int8_t>();
  SO_CHECK(rd.done(), "trailing bytes in request message");
  return m;
}

// A tensor of a cached slot travels as its slot number alone (Note [Response cache]).
std::vector<uint8_t> EncodeResponses(const std::vector<Response>& responses) {
  WireWriter w;
  w.Put<uint8_t>(static_cast<uint8_t>(MessageType::kResponses));
  w.Put<uint32_t>(static_cast<uint32_t>(responses.size()));
  for (const Response& r : responses) {
    w.Put<int32_t>(r.collective);
    w.Put<int32_t>(static_cast<int32_t>(r.dtype));
    w.Put<int32_t>(static_cast<int32_t>(r.reduce_op));
    w.Put<int32_t>(r.root);
    w.Put<double>(r.prescale);
    w.Put<double>(r.postscale);
    w.PutVector(r.joined_ranks);
    w.Put<int32_t>(r.error_code);
    if (r.is_error()) {
      w.PutString(r.error_message);
      w.PutVector(r.culprit_ranks);
    }
    w.Put<int32_t>(r.last_joined_rank);
    w.Put<uint32_t>(static_cast<uint32_t>(r.tensors.size()));
    // Shapes are needed only by ranks that did not submit the tensor (joined ranks) and for
    // allgather's per-rank rows; a cached tensor otherwise travels as its slot number.
    const bool need_shapes = !r.joined_ranks.empty() || r.is_error();
    for (const ResponseTensor& t : r.tensors) {
      const bool compact = t.cache_slot >= 0 && !t.assigns_slot && !need_shapes;
      w.Put<int32_t>(t.cache_slot);
      w.Put<uint8_t>(static_cast<uint8_t>((compact ? 0 : 1) | (t.assigns_slot ? 2 : 0) |
                                          (t.is_part() ? 4 : 0)));
      if (!compact) {
        w.PutString(t.name);
        w.PutVector(t.shape);
      }
      if (t.is_part()) {
        w.Put<int64_t>(t.part_first);
        w.Put<int64_t>(t.part_count);
      }
      w.PutVector(t.first_dims);
    }
  }
  return w.Take();
}

std::vector<Response> DecodeResponses(const std::vector<uint8_t>& bytes) {
  WireReader rd(bytes);
  SO_CHECK(rd.Get<uint8_t>() == static_cast<uint8_t>(MessageType::kResponses),
           "not a response message");
  uint32_t n = rd.Get<uint32_t>();
  std::vector<Response> out(n);
  for (Response& r : out) {
    r.collective = rd.Get<int32_t>();
    r.dtype = static_cast<DataType>(rd.Get<int32_t>());
    r.reduce_op = static_cast<ReduceOp>(rd.Get<int32_t>());
    r.root = rd.Get<int32_t>();
    r.prescale = rd.Get<double>();
    r.postscale = rd.Get<double>();
    r.joined_ranks = rd.GetVector<int32_t>();
    r.error_code = rd.Get<int32_t>();
    if (r.is_error()) {
      r.error_message = rd.GetString();
      r.culprit_ranks = rd.GetVector<int32_t>();
    }
    r.last_joined_rank = rd.Get<int32_t>();
    uint32_t nt = rd.Get<uint32_t>();
    r.tensors.resize(nt);
    for (ResponseTensor& t : r.tensors) {
      t.cache_slot = rd.Get<int32_t>();
      uint8_t flags = rd.Get<uint8_t>();
      t.assigns_slot = (flags & 2) != 0;
      if (flags & 1) {
        t.name = rd.GetString();
        t.shape = rd.GetVector<int64_t>();
      }
      if (flags & 4) {
        t.part_first = rd.Get<int64_t>();
        t.part_count = rd.Get<int64_t>();
      }
      t.first_dims = rd.GetVector<int64_t>();
    }
  }
  SO_CHECK(rd.done(), "trailing bytes in response message");
  return out;
}

std::vector<uint8_t> EncodeSignal(MessageType type) { return {static_cast<uint8_t>(type)}; }

std::vector<uint8_t> EncodeShutdown(const std::string& reason) {
  WireWriter w;
  w.Put<uint8_t>(static_cast<uint8_t>(MessageType::kShutdown));
  w.PutString(reason);
  return w.Take();
}

std::vector<uint8_t> EncodeNotice(const std::string& text) {
  WireWriter w;
  w.Put<uint8_t>(static_cast<uint8_t>(MessageType::kNotice));
  w.PutString(text);
  return w.Take();
}

std::string DecodeNotice(const std::vector<uint8_t>& bytes) {
  WireReader rd(bytes);
  SO_CHECK(rd.Get<uint8_t>() == static_cast<uint8_t>(MessageType::kNotice), "not a notice");
  std::string text = rd.GetString();
  SO_CHECK(rd.done(), "trailing bytes in notice message");
  return text;
}

std::string DecodeShutdownReason(const std::vector<uint8_t>& bytes) {
  if (bytes.size() <= 1) return "";
  WireReader rd(bytes);
  rd.Get<uint8_t>();
  std::string reason = rd.GetString();
  SO_CHECK(rd.done(), "trailing bytes in shutdown message");
  return reason;
}

MessageType PeekType(const std::vector<uint8_t>& bytes) {
  SO_CHECK(!bytes.empty(), "empty control message");
  return static_cast<MessageType>(bytes[0]);
}

}  // namespace scaleout
