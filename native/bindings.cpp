// Python bindings of the native data path (inagg.hostlib._native). Only the binding glue lives
// here; each concern has its own file beside it (engine.hpp: the slot engine; host_loop.hpp: the
// host aggregator's packet loop; switch_bindings.cpp: the soft switch; stream_bindings.cpp: the
// worker's stream). Packet work runs with the GIL released; configuration and counters are plain
// Python data.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <system_error>

#include "engine.hpp"
#include "host_loop.hpp"
#include "source_digest.hpp"  // generated into the build folder (cmake/source_digest.cmake)

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// A read-only view of any object with the buffer protocol (bytes, bytearray, memoryview).
class ByteView {
public:
    explicit ByteView(nb::handle obj) {
        if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) {
            throw nb::python_error();
        }
    }
    ~ByteView() { PyBuffer_Release(&view_); }
    ByteView(const ByteView&) = delete;
    ByteView& operator=(const ByteView&) = delete;

    const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
    size_t size() const { return static_cast<size_t>(view_.len); }

private:
    Py_buffer view_{};
};

// An uplink as Python passes it: (parent sender id, rank at the parent, slot_base there).
using UplinkArg = std::optional<std::tuple<inagg::SenderId, int64_t, int64_t>>;
// An ATP job's peer (hostlib/aggregator/atp_reference.py), or None.
using PeerArg = std::optional<inagg::SenderId>;
using JobArg = std::tuple<int64_t, int64_t, int64_t, int64_t, std::vector<inagg::SenderId>,
                          UplinkArg, int64_t, PeerArg>;

inagg::JobConfig job_config(int64_t job_id, int64_t epoch, int64_t slot_base, int64_t slot_count,
                            std::vector<inagg::SenderId> members, const UplinkArg& uplink,
                            int64_t n_children, const PeerArg& atp_peer) {
    inagg::JobConfig job{job_id, epoch, slot_base, slot_count, std::move(members)};
    job.n_children = n_children;
    job.has_atp_peer = atp_peer.has_value();
    job.atp_peer = atp_peer.value_or(0);
    if (uplink) {
        job.has_uplink = true;
        job.uplink =
            inagg::Uplink{std::get<0>(*uplink), std::get<1>(*uplink), std::get<2>(*uplink)};
    }
    return job;
}

nb::dict counters_dict(const inagg::JobCounters& c) {
    nb::dict drops;
    for (size_t i = 0; i < inagg::kOutcomes; ++i) {
        if (c.drops[i]) {
            drops[inagg::outcome_name(static_cast<inagg::Outcome>(i))] = c.drops[i];
        }
    }
    nb::dict d;
    d["packets"] = c.packets;
    d["aggregated"] = c.aggregated;
    d["duplicates"] = c.duplicates;
    d["results"] = c.results;
    d["resent_results"] = c.resent_results;
    d["collisions"] = c.collisions;
    d["drops"] = drops;
    return d;
}

nb::dict snapshot(inagg::Engine& engine) {
    std::lock_guard<std::mutex> lock(engine.mutex());
    nb::dict jobs;
    for (const auto& [id, c] : engine.counters()) {
        jobs[nb::int_(id)] = counters_dict(c);
    }
    nb::dict drops;
    for (size_t i = 0; i < inagg::kOutcomes; ++i) {
        if (engine.global_drops()[i]) {
            drops[inagg::outcome_name(static_cast<inagg::Outcome>(i))] = engine.global_drops()[i];
        }
    }
    nb::dict d;
    d["jobs"] = jobs;
    d["drops"] = drops;
    return d;
}

// (outcome, job, rank, result bytes or None, owner) for one packet.
nb::tuple process_one(inagg::Engine& engine, nb::handle data, inagg::SenderId sender,
                      bool framing_ok) {
    ByteView view(data);
    std::vector<uint8_t> out(engine.max_result_bytes());
    inagg::Emit emit;
    inagg::Outcome outcome;
    {
        nb::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(engine.mutex());
        emit = engine.process(view.data(), view.size(), sender, framing_ok, out.data());
        outcome = engine.last_outcome();
    }
    nb::object result = nb::none();
    if (emit.length) {
        result = nb::bytes(reinterpret_cast<const char*>(out.data()), emit.length);
    }
    return nb::make_tuple(static_cast<int>(outcome), emit.job, emit.rank, result, emit.owner);
}

// Packets laid end to end in `data` (lengths give each one's size): (outcomes as bytes, list of
// (packet index, job, rank, result bytes, owner)).
nb::tuple process_batch(inagg::Engine& engine, nb::handle data, const std::vector<size_t>& lengths,
                        const std::vector<inagg::SenderId>& senders,
                        const std::vector<bool>& framing_ok) {
    if (senders.size() != lengths.size() || framing_ok.size() != lengths.size()) {
        throw std::invalid_argument(
            "process_batch: lengths, senders and framing_ok differ in size");
    }
    ByteView view(data);
    std::vector<inagg::Received> packets(lengths.size());
    size_t at = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
        if (lengths[i] > view.size() - at) {
            throw std::invalid_argument("process_batch: lengths exceed the buffer");
        }
        packets[i] = inagg::Received{view.data() + at, lengths[i], senders[i], framing_ok[i]};
        at += lengths[i];
    }
    std::vector<uint8_t> arena;
    std::vector<inagg::Emitted> emitted;
    std::vector<inagg::Outcome> outcomes;
    {
        nb::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(engine.mutex());
        engine.process_batch(packets, arena, emitted, outcomes);
    }
    nb::list emits;
    for (const inagg::Emitted& e : emitted) {
        emits.append(nb::make_tuple(
            e.packet, e.emit.job, e.emit.rank,
            nb::bytes(reinterpret_cast<const char*>(arena.data() + e.at), e.emit.length),
            e.emit.owner));
    }
    return nb::make_tuple(
        nb::bytes(reinterpret_cast<const char*>(outcomes.data()), outcomes.size()), emits);
}

// The outcome codes and the P4 drop codes, for the Python twin to check against.
void bind_outcomes(nb::module_& m) {
    nb::dict outcomes;
    for (size_t i = 1; i < inagg::kOutcomes; ++i) {
        outcomes[inagg::outcome_name(static_cast<inagg::Outcome>(i))] = i;
    }
    m.attr("OUTCOMES") = outcomes;
    m.attr("EMIT_UPSTREAM") = inagg::kUpstream;  // an emit's rank: to the job's parent
    m.def(
        "p4_drop_code",
        [](int outcome) {
            if (outcome < 0 || outcome >= static_cast<int>(inagg::kOutcomes)) {
                throw std::invalid_argument("no outcome " + std::to_string(outcome));
            }
            return inagg::p4_drop_code(static_cast<inagg::Outcome>(outcome));
        },
        "outcome"_a, "DROP_*/GLOBAL_DROP_* code of a drop outcome, else -1");
}

// The engine's configuration: its jobs and a switch's ATP pool.
void bind_engine_config(nb::class_<inagg::Engine>& engine) {
    engine
        .def(
            "set_job",
            [](inagg::Engine& e, int64_t job_id, int64_t epoch, int64_t base, int64_t count,
               std::vector<inagg::SenderId> members, const UplinkArg& uplink, int64_t n_children,
               const PeerArg& atp_peer) {
                std::lock_guard<std::mutex> lock(e.mutex());
                e.set_job(job_config(job_id, epoch, base, count, std::move(members), uplink,
                                     n_children, atp_peer));
            },
            "job_id"_a, "epoch"_a, "slot_base"_a, "slot_count"_a, "members"_a,
            "uplink"_a = nb::none(), "n_children"_a = 0, "atp_peer"_a = nb::none())
        .def(
            "set_atp_pool",
            [](inagg::Engine& e, int64_t base, int64_t count) {
                std::lock_guard<std::mutex> lock(e.mutex());
                e.set_atp_pool(base, count);
            },
            "base"_a, "count"_a,
            "a switch's slots for ATP jobs (hostlib/aggregator/atp_reference.py)")
        .def_prop_ro("atp_held",
                     [](inagg::Engine& e) {
                         std::lock_guard<std::mutex> lock(e.mutex());
                         return e.atp_held();
                     })
        .def("remove_job",
             [](inagg::Engine& e, uint16_t job_id) {
                 std::lock_guard<std::mutex> lock(e.mutex());
                 e.remove_job(job_id);
             })
        .def(
            "replace_jobs",
            [](inagg::Engine& e, const std::vector<JobArg>& wanted) {
                std::vector<inagg::JobConfig> jobs;
                for (const auto& [id, epoch, base, count, members, uplink, n_children, peer] :
                     wanted) {
                    jobs.push_back(
                        job_config(id, epoch, base, count, members, uplink, n_children, peer));
                }
                std::lock_guard<std::mutex> lock(e.mutex());
                e.replace_jobs(jobs);
            },
            "jobs"_a,
            "[(job_id, epoch, slot_base, slot_count, members, uplink or None, n_children, "
            "atp_peer or None)]")
        .def("job_ids", [](inagg::Engine& e) {
            std::lock_guard<std::mutex> lock(e.mutex());
            return e.job_ids();
        });
}

void bind_engine(nb::module_& m) {
    bind_outcomes(m);
    nb::class_<inagg::Engine> engine(m, "Engine", "The slot engine (native/engine.hpp)");
    engine
        .def(nb::init<uint32_t, uint32_t, bool>(), "n_slots"_a, "values_per_packet"_a,
             "host_mode"_a)
        .def_prop_ro("n_slots", &inagg::Engine::n_slots)
        .def_prop_ro("values_per_packet", &inagg::Engine::values_per_packet);
    bind_engine_config(engine);
    engine.def("process", &process_one, "data"_a, "sender"_a, "framing_ok"_a = true)
        .def("process_batch", &process_batch, "data"_a, "lengths"_a, "senders"_a, "framing_ok"_a)
        .def_prop_ro("last_outcome",
                     [](inagg::Engine& e) { return static_cast<int>(e.last_outcome()); })
        .def("snapshot_counters", &snapshot);
}

void bind_host_loop(nb::module_& m) {
    nb::class_<inagg::HostLoop>(m, "HostLoop",
                                "The host aggregator's packet loop (native/host_loop.hpp)")
        // keep_alive: the loop uses the engine for as long as it exists
        .def(nb::init<inagg::Engine&, int, double, uint64_t>(), "engine"_a, "fd"_a,
             "drop_rate"_a = 0.0, "seed"_a = 0, nb::keep_alive<1, 2>())
        .def("run", &inagg::HostLoop::run, nb::call_guard<nb::gil_scoped_release>(),
             "Serve the socket until stop(), without the GIL")
        .def("stop", &inagg::HostLoop::stop)
        .def_prop_ro("injected_drops", &inagg::HostLoop::injected_drops)
        .def_prop_ro("send_errors", &inagg::HostLoop::send_errors);
}

// An operating system error (net.hpp's policy: a socket call that failed) as Python's OSError
// with its errno, so Python sees the subclass of that errno (ConnectionRefusedError, ...); its
// message names the call and the socket.
void translate_os_error(const std::exception_ptr& error, void*) {
    try {
        std::rethrow_exception(error);
    } catch (const std::system_error& e) {
        nb::object args = nb::make_tuple(e.code().value(), e.what());
        PyErr_SetObject(PyExc_OSError, args.ptr());
    }
}

}  // namespace

void bind_switch(nb::module_& m);  // switch_bindings.cpp
namespace inagg {
void bind_stream(nb::module_& m);       // stream_bindings.cpp
void bind_host_reduce(nb::module_& m);  // host_reduce.cpp
void bind_host_tiny(nb::module_& m);    // host_tiny.cpp
}  // namespace inagg

NB_MODULE(_native, m) {
    m.doc() = "inagg's per-packet data path in C++ (see native/*.hpp)";
    m.attr("SOURCE_DIGEST") = inagg::kSourceDigest;  // hostlib/native_build.py checks it
    nb::register_exception_translator(&translate_os_error);
    m.def("sender_id_ipv4", &inagg::sender_id_ipv4, "addr"_a, "port"_a,
          "The engine's id of a UDP sender: (IPv4 address << 16) | port");
    bind_engine(m);
    bind_host_loop(m);
    bind_switch(m);
    inagg::bind_stream(m);
    inagg::bind_host_reduce(m);
    inagg::bind_host_tiny(m);
}
