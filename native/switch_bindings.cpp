// Python bindings of the software switch's core (hostlib._native.SwitchPipeline, SwitchLoop):
// bmv2_env/native_pipeline.py mirrors the P4Runtime server's tables into a SwitchPipeline and
// bmv2_env/soft_switch.py hands its sockets to a SwitchLoop. Packet work never holds the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>

#include "switch_loop.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using inagg::SwitchPipeline;

template <size_t N, typename T>
std::array<T, N> fixed_array(const std::vector<T>& v, const char* what) {
    if (v.size() != N)
        throw std::invalid_argument(std::string(what) + ": expected " + std::to_string(N) +
                                    " values, got " + std::to_string(v.size()));
    std::array<T, N> a{};
    std::copy(v.begin(), v.end(), a.begin());
    return a;
}

std::shared_ptr<SwitchPipeline> make_pipeline(uint32_t n_slots, uint32_t k,
                                              const std::vector<size_t>& counter_sizes,
                                              const std::vector<int8_t>& job_drop_codes,
                                              size_t n_drop_reasons,
                                              const std::vector<int8_t>& global_drop_codes) {
    return std::make_shared<SwitchPipeline>(
        n_slots, k, fixed_array<inagg::kCounters>(counter_sizes, "counter_sizes"),
        fixed_array<inagg::kOutcomes>(job_drop_codes, "job_drop_codes"), n_drop_reasons,
        fixed_array<inagg::kOutcomes>(global_drop_codes, "global_drop_codes"));
}

// Holds the pipeline's lock across a Python `with` block (one P4Runtime Write).
struct PipelineHold {
    std::shared_ptr<SwitchPipeline> pipeline;
    void enter() {
        nb::gil_scoped_release release;
        pipeline->mutex().lock();
    }
    void exit() { pipeline->mutex().unlock(); }
};

// Run `fn(tables)` under the pipeline's lock.
template <typename Fn>
void with_tables(SwitchPipeline& p, Fn fn) {
    std::lock_guard<std::recursive_mutex> lock(p.mutex());
    fn(p.tables());
}

nb::list process_frame(SwitchPipeline& p, uint16_t port, nb::bytes frame) {
    inagg::OutputBatch out;
    {
        std::lock_guard<std::recursive_mutex> lock(p.mutex());
        p.process(port, reinterpret_cast<const uint8_t*>(frame.c_str()), frame.size(), out);
    }
    nb::list frames;
    for (size_t i = 0; i < out.size(); ++i)
        frames.append(nb::make_tuple(
            out.port(i), nb::bytes(reinterpret_cast<const char*>(out.data(i)), out.len(i))));
    return frames;
}

void bind_pipeline(nb::module_& m) {
    using inagg::SwitchTables;
    nb::class_<PipelineHold>(m, "_PipelineHold")
        .def("__enter__", &PipelineHold::enter)
        .def("__exit__", [](PipelineHold& h, nb::args) { h.exit(); });

    nb::class_<SwitchPipeline>(m, "SwitchPipeline",
                               "The software switch's tables, slot engine and counters "
                               "(native/switch_pipeline.hpp)")
        .def(nb::new_(&make_pipeline), "n_slots"_a, "values_per_packet"_a, "counter_sizes"_a,
             "job_drop_codes"_a, "n_drop_reasons"_a, "global_drop_codes"_a)
        .def("hold", [](nb::handle self) { return PipelineHold{nb::cast<std::shared_ptr<SwitchPipeline>>(self)}; },
             "A context manager holding the pipeline's lock: no packet sees half a write")
        .def("set_job_admit",
             [](SwitchPipeline& p, uint16_t job_id, uint8_t job_index, uint16_t slot_base,
                uint16_t slot_count, uint8_t n_workers, uint16_t epoch, uint16_t mcast_grp,
                uint8_t encap) {
                 with_tables(p, [&](SwitchTables& t) {
                     t.jobs[job_id] = inagg::JobAdmit{job_index, slot_base, slot_count, n_workers,
                                                      epoch, mcast_grp, encap};
                 });
             })
        .def("remove_job_admit",
             [](SwitchPipeline& p, uint16_t job_id) {
                 with_tables(p, [&](SwitchTables& t) { t.jobs.erase(job_id); });
             })
        .def("set_replica",
             [](SwitchPipeline& p, uint16_t job_id, uint16_t replica, uint64_t mac, uint32_t addr,
                bool roce, uint16_t udp_port, uint32_t qp, uint32_t rkey) {
                 with_tables(p, [&](SwitchTables& t) {
                     t.replicas[SwitchTables::replica_key(job_id, replica)] =
                         inagg::ReplicaAddress{mac, addr, roce, udp_port, qp, rkey};
                 });
             })
        .def("remove_replica",
             [](SwitchPipeline& p, uint16_t job_id, uint16_t replica) {
                 with_tables(p, [&](SwitchTables& t) {
                     t.replicas.erase(SwitchTables::replica_key(job_id, replica));
                 });
             })
        .def("set_l2",
             [](SwitchPipeline& p, uint64_t mac, uint8_t kind, uint16_t arg) {
                 with_tables(p, [&](SwitchTables& t) {
                     t.l2[mac] = inagg::L2Action{inagg::L2Kind(kind), arg};
                 });
             })
        .def("remove_l2",
             [](SwitchPipeline& p, uint64_t mac) {
                 with_tables(p, [&](SwitchTables& t) { t.l2.erase(mac); });
             })
        .def("set_l2_default",
             [](SwitchPipeline& p, uint8_t kind, uint16_t arg) {
                 with_tables(p, [&](SwitchTables& t) {
                     t.l2_default = inagg::L2Action{inagg::L2Kind(kind), arg};
                 });
             })
        .def("set_group",
             [](SwitchPipeline& p, uint16_t group,
                const std::vector<std::pair<uint16_t, uint16_t>>& replicas) {
                 std::vector<inagg::Replica> copies;
                 for (const auto& [port, instance] : replicas) copies.push_back({port, instance});
                 with_tables(p, [&](SwitchTables& t) { t.groups[group] = std::move(copies); });
             })
        .def("remove_group",
             [](SwitchPipeline& p, uint16_t group) {
                 with_tables(p, [&](SwitchTables& t) { t.groups.erase(group); });
             })
        .def("replace_jobs",
             [](SwitchPipeline& p,
                const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t,
                                             std::vector<inagg::SenderId>>>& wanted) {
                 std::vector<inagg::JobConfig> jobs;
                 for (const auto& [id, epoch, base, count, members] : wanted)
                     jobs.push_back(inagg::JobConfig{id, epoch, base, count, members});
                 std::lock_guard<std::recursive_mutex> lock(p.mutex());
                 p.engine().replace_jobs(jobs);
             },
             "jobs"_a, "[(job_id, epoch, slot_base, slot_count, members)]; ValueError if the "
                       "slot pool cannot hold them")
        .def("job_ids",
             [](SwitchPipeline& p) {
                 std::lock_guard<std::recursive_mutex> lock(p.mutex());
                 return p.engine().job_ids();
             })
        .def("counter",
             [](SwitchPipeline& p, size_t which) {
                 if (which >= inagg::kCounters) throw std::out_of_range("no such counter");
                 std::vector<int64_t>& cells = p.counters().cells(inagg::Counter(which));
                 return nb::ndarray<nb::numpy, const int64_t, nb::ndim<1>>(cells.data(),
                                                                          {cells.size()});
             },
             nb::rv_policy::reference_internal,
             "A live read-only view of counter `which` (switch_tables.hpp's Counter order)")
        .def("process", &process_frame, "port"_a, "frame"_a,
             "One frame in: the (egress port, frame) pairs it causes (the slow path)");
}

void bind_loop(nb::module_& m) {
    nb::class_<inagg::SwitchLoop>(m, "SwitchLoop",
                                  "The software switch's packet loop thread "
                                  "(native/switch_loop.hpp)")
        .def(nb::init<>())
        .def("add_udp_ports", &inagg::SwitchLoop::add_udp_ports, "fd"_a, "bind_addr"_a,
             "peers"_a)
        .def("add_raw_port", &inagg::SwitchLoop::add_raw_port, "fd"_a, "port"_a)
        .def("capture", &inagg::SwitchLoop::capture, "port"_a, "in_path"_a, "out_path"_a)
        .def("set_pipeline", &inagg::SwitchLoop::set_pipeline, "pipeline"_a.none(),
             nb::call_guard<nb::gil_scoped_release>())
        .def("start", &inagg::SwitchLoop::start)
        .def("stop", &inagg::SwitchLoop::stop, nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("running", &inagg::SwitchLoop::running)
        .def("stats", [](const inagg::SwitchLoop& loop) {
            const inagg::LoopStats& s = loop.stats();
            nb::dict d;
            d["received"] = s.received.load();
            d["sent"] = s.sent.load();
            d["unknown_peer"] = s.unknown_peer.load();
            d["send_errors"] = s.send_errors.load();
            d["wakeups"] = s.wakeups.load();
            return d;
        });
}

}  // namespace

void bind_switch(nb::module_& m) {
    m.def("switch_sender_id", &inagg::switch_sender_id, "port"_a, "addr"_a,
          "The engine's id of a switch sender: (ingress port << 32) | IPv4 source");
    m.def("unbound_sender_id", &inagg::unbound_sender_id, "rank"_a,
          "The engine's id for a rank no worker_table entry binds: no packet carries it");
    m.attr("SWITCH_LOOP_BATCH") = inagg::SwitchLoop::kBatch;
    bind_pipeline(m);
    bind_loop(m);
}
