// Python bindings of the software switch's core (inagg.hostlib._native.SwitchPipeline, SwitchLoop):
// bmv2_env/softswitch/pipeline.py mirrors the P4Runtime server's tables into a SwitchPipeline and
// bmv2_env/softswitch/switch.py hands its sockets to a SwitchLoop. Packet work never holds the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "switch_loop.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using inagg::SwitchPipeline;

std::shared_ptr<SwitchPipeline> make_pipeline(uint32_t n_slots, uint32_t k,
                                              const std::vector<size_t>& counter_sizes,
                                              size_t n_drop_reasons) {
    if (counter_sizes.size() != inagg::kCounters)
        throw std::invalid_argument("counter_sizes: expected " + std::to_string(inagg::kCounters) +
                                    " sizes, got " + std::to_string(counter_sizes.size()));
    std::array<size_t, inagg::kCounters> sizes{};
    std::copy(counter_sizes.begin(), counter_sizes.end(), sizes.begin());
    return std::make_shared<SwitchPipeline>(n_slots, k, sizes, n_drop_reasons);
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

// Run `fn(pipeline)` under the pipeline's lock, without the GIL while waiting for it (the
// thread holding the lock may need the GIL to finish a P4Runtime Write). `fn` touches no Python.
template <typename Fn>
auto locked(SwitchPipeline& p, Fn fn) {
    nb::gil_scoped_release release;
    std::lock_guard<std::recursive_mutex> lock(p.mutex());
    return fn(p);
}

template <typename Fn>
void with_tables(SwitchPipeline& p, Fn fn) {
    locked(p, [&](SwitchPipeline& q) { fn(q.tables()); });
}

nb::list process_frame(SwitchPipeline& p, uint16_t port, nb::bytes frame) {
    inagg::OutputBatch out;
    const uint8_t* data = reinterpret_cast<const uint8_t*>(frame.c_str());
    size_t len = frame.size();  // `frame` stays referenced by the caller while the GIL is out
    locked(p, [&](SwitchPipeline& q) { q.process(port, data, len, out); });
    nb::list frames;
    for (size_t i = 0; i < out.size(); ++i)
        frames.append(nb::make_tuple(
            out.port(i), nb::bytes(reinterpret_cast<const char*>(out.data(i)), out.len(i))));
    return frames;
}

// The frames the loop captured since the last call, as [(port, "in"|"out", usec, frame)]; the
// queue is swapped out without the GIL, the Python objects made with it.
nb::list take_captures(inagg::SwitchLoop& loop) {
    inagg::CaptureBatch batch;
    {
        nb::gil_scoped_release release;
        loop.take_captures(batch);
    }
    nb::list records;
    for (const auto& r : batch.records)
        records.append(nb::make_tuple(
            r.port, r.sent ? "out" : "in", r.usec,
            nb::bytes(reinterpret_cast<const char*>(batch.bytes.data() + r.offset), r.len)));
    return records;
}

using PipelineClass = nb::class_<SwitchPipeline>;
using inagg::SwitchTables;

// JobAdmission's and ReplicaRewrite's tables: job_table, worker_table, replica_table.
void bind_job_tables(PipelineClass& cls) {
    cls.def("set_job_admit",
            [](SwitchPipeline& p, uint16_t job_id, uint8_t job_index, uint16_t slot_base,
               uint16_t slot_count, uint8_t n_workers, uint16_t epoch, uint16_t mcast_grp,
               uint8_t encap) {
                with_tables(p, [&](SwitchTables& t) {
                    t.jobs[job_id] = inagg::JobAdmit{job_index, slot_base, slot_count, n_workers,
                                                     epoch,     mcast_grp, encap};
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
        .def("set_worker",
             [](SwitchPipeline& p, uint16_t job_id, uint8_t rank, uint16_t port, uint32_t addr,
                uint64_t mac, uint16_t udp_port) {
                 with_tables(p, [&](SwitchTables& t) {
                     t.workers[SwitchTables::worker_key(job_id, rank)] =
                         inagg::WorkerBinding{port, addr, mac, udp_port};
                 });
             })
        .def("remove_worker",
             [](SwitchPipeline& p, uint16_t job_id, uint8_t rank) {
                 with_tables(p, [&](SwitchTables& t) {
                     t.workers.erase(SwitchTables::worker_key(job_id, rank));
                 });
             })
        .def("remove_replica", [](SwitchPipeline& p, uint16_t job_id, uint16_t replica) {
            with_tables(p, [&](SwitchTables& t) {
                t.replicas.erase(SwitchTables::replica_key(job_id, replica));
            });
        });
}

// TreeUplink's uplink_table (docs/trees.md).
void bind_uplink_table(PipelineClass& cls) {
    cls.def("set_uplink",
            [](SwitchPipeline& p, uint16_t job_id, uint16_t port, uint8_t rank, uint16_t slot_base,
               uint64_t mac, uint32_t addr, uint16_t udp_port, uint64_t src_mac, uint32_t src_addr,
               uint16_t src_udp_port) {
                with_tables(p, [&](SwitchTables& t) {
                    t.uplinks[job_id] =
                        inagg::UplinkEntry{port,     rank,    slot_base, mac,         addr,
                                           udp_port, src_mac, src_addr,  src_udp_port};
                });
            })
        .def("remove_uplink", [](SwitchPipeline& p, uint16_t job_id) {
            with_tables(p, [&](SwitchTables& t) { t.uplinks.erase(job_id); });
        });
}

using GuardFields = std::array<uint32_t, inagg::kGuardRowFields>;

// Remove the TNA host_port_table row with `row`'s match (priority, values, masks).
void drop_guard_row(std::vector<inagg::GuardRow>& rows, const inagg::GuardRow& row) {
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [&](const inagg::GuardRow& r) { return r.same_match(row); }),
               rows.end());
}

// A TNA host_port_table row in place of the one with its match, else added; highest priority first.
void put_guard_row(std::vector<inagg::GuardRow>& rows, const inagg::GuardRow& row) {
    drop_guard_row(rows, row);
    auto at = std::find_if(rows.begin(), rows.end(),
                           [&](const inagg::GuardRow& r) { return r.priority < row.priority; });
    rows.insert(at, row);
}

// SourceGuard's host_port_table, in either program's shape.
void bind_guard_table(PipelineClass& cls) {
    cls.def("set_host_port",
            [](SwitchPipeline& p, uint16_t port, uint32_t aggregator_addr, uint32_t host_aggregator,
               bool is_aggregator) {
                with_tables(p, [&](SwitchTables& t) {
                    t.host_ports[port] =
                        inagg::GuardPort{aggregator_addr, host_aggregator, is_aggregator};
                });
            })
        .def("remove_host_port",
             [](SwitchPipeline& p, uint16_t port) {
                 with_tables(p, [&](SwitchTables& t) { t.host_ports.erase(port); });
             })
        .def("set_guard_row",
             [](SwitchPipeline& p, uint16_t port, int32_t priority, const GuardFields& value,
                const GuardFields& mask, uint8_t reason) {
                 inagg::GuardRow row{priority, value, mask, reason};
                 with_tables(p, [&](SwitchTables& t) { put_guard_row(t.guard_rows[port], row); });
             })
        .def("remove_guard_row", [](SwitchPipeline& p, uint16_t port, int32_t priority,
                                    const GuardFields& value, const GuardFields& mask) {
            inagg::GuardRow row{priority, value, mask, 0};
            with_tables(p, [&](SwitchTables& t) {
                auto& rows = t.guard_rows[port];
                drop_guard_row(rows, row);
                if (rows.empty()) t.guard_rows.erase(port);
            });
        });
}

// Forwarding's l2_table and the packet replication engine's multicast groups.
void bind_l2_tables(PipelineClass& cls) {
    cls.def("set_l2",
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
        .def("remove_group", [](SwitchPipeline& p, uint16_t group) {
            with_tables(p, [&](SwitchTables& t) { t.groups.erase(group); });
        });
}

// ATP (docs/atp.md): the pool (tables and engine) and the ATP jobs' admissions.
void bind_atp(PipelineClass& cls) {
    cls.def(
           "set_atp_pool",
           [](SwitchPipeline& p, uint16_t base, uint16_t count, uint32_t host_addr,
              uint16_t host_port, uint64_t switch_mac, uint32_t switch_addr,
              uint16_t switch_udp_port) {
               locked(p, [&](SwitchPipeline& q) {
                   q.engine().set_atp_pool(base, count);  // throws before the tables change
                   q.tables().atp = inagg::AtpPool{
                       base, count, host_addr, host_port, switch_mac, switch_addr, switch_udp_port};
               });
           },
           "The pool [base, base + count) (0: none), the host aggregator's IPv4 and UDP port, "
           "the switch's aggregator MAC, IPv4 and UDP port; ValueError if the engine refuses")
        .def(
            "set_atp_jobs",
            [](SwitchPipeline& p, const std::vector<std::tuple<uint16_t, uint8_t, uint8_t>>& jobs) {
                with_tables(p, [&](SwitchTables& t) {
                    t.atp_jobs.clear();
                    for (const auto& [id, index, n_workers] : jobs)
                        t.atp_jobs[id] = inagg::AtpAdmit{index, n_workers};
                });
            },
            "jobs"_a, "[(job_id, job_index, n_workers)]: every ATP job the switch admits")
        .def(
            "atp_held",
            [](SwitchPipeline& p) {
                return locked(p, [](SwitchPipeline& q) { return q.engine().atp_held(); });
            },
            "Aggregators of the pool a live round holds");
}

// The slot engine's jobs, the counters and the per-frame slow path.
void bind_engine_and_counters(PipelineClass& cls) {
    using Uplink = std::optional<std::pair<int64_t, int64_t>>;  // (rank, slot_base) at the parent
    cls.def(
           "replace_jobs",
           [](SwitchPipeline& p,
              const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t,
                                           std::vector<inagg::SenderId>, Uplink, int64_t, bool>>&
                  wanted) {
               std::vector<inagg::JobConfig> jobs;
               for (const auto& [id, epoch, base, count, members, uplink, n_children, atp] :
                    wanted) {
                   inagg::JobConfig job{id, epoch, base, count, members};
                   job.n_children = n_children;
                   job.has_atp_peer = atp;
                   job.atp_peer = atp ? inagg::kAtpPeerSender : 0;
                   if (uplink) {
                       job.has_uplink = true;
                       job.uplink =
                           inagg::Uplink{inagg::kParentSender, uplink->first, uplink->second};
                   }
                   jobs.push_back(job);
               }
               locked(p, [&](SwitchPipeline& q) { q.engine().replace_jobs(jobs); });
           },
           "jobs"_a,
           "[(job_id, epoch, slot_base, slot_count, members, (rank, slot_base) of the "
           "uplink or None, n_children, ATP: the host aggregator is its atp_peer)]; ValueError "
           "if the slot pool cannot hold them")
        .def("job_ids",
             [](SwitchPipeline& p) {
                 return locked(p, [](SwitchPipeline& q) { return q.engine().job_ids(); });
             })
        .def(
            "counter",
            [](SwitchPipeline& p, size_t which) {
                if (which >= inagg::kCounters) throw std::out_of_range("no such counter");
                std::vector<int64_t>& cells = p.counters().cells(inagg::Counter(which));
                return nb::ndarray<nb::numpy, const int64_t, nb::ndim<1>>(cells.data(),
                                                                          {cells.size()});
            },
            nb::rv_policy::reference_internal,
            "A live read-only view of counter `which` (switch_tables.hpp's Counter order)")
        .def(
            "set_counter",
            [](SwitchPipeline& p, size_t which, size_t index, int64_t value) {
                if (which >= inagg::kCounters) throw std::out_of_range("no such counter");
                bool ok = locked(p, [&](SwitchPipeline& q) {
                    return q.counters().set(inagg::Counter(which), index, value);
                });
                if (!ok) throw std::out_of_range("counter index out of range");
            },
            "which"_a, "index"_a, "value"_a, "Set one counter cell (P4Runtime MODIFY)")
        .def("process", &process_frame, "port"_a, "frame"_a,
             "One frame in: the (egress port, frame) pairs it causes (the slow path)");
}

void bind_pipeline(nb::module_& m) {
    nb::class_<PipelineHold>(m, "_PipelineHold")
        .def("__enter__", &PipelineHold::enter)
        .def("__exit__", [](PipelineHold& h, nb::args) { h.exit(); });

    PipelineClass cls(m, "SwitchPipeline",
                      "The software switch's tables, slot engine and counters "
                      "(native/switch_pipeline.hpp)");
    cls.def(nb::new_(&make_pipeline), "n_slots"_a, "values_per_packet"_a, "counter_sizes"_a,
            "n_drop_reasons"_a)
        .def(
            "hold",
            [](nb::handle self) {
                return PipelineHold{nb::cast<std::shared_ptr<SwitchPipeline>>(self)};
            },
            "A context manager holding the pipeline's lock: no packet sees half a write");
    bind_job_tables(cls);
    bind_uplink_table(cls);
    bind_guard_table(cls);
    bind_l2_tables(cls);
    bind_atp(cls);
    bind_engine_and_counters(cls);
}

// The impaired directions' stats as dicts, with the keys of the twin's (impair.py's stats()).
nb::list stat_dicts(const std::vector<inagg::PortImpairments::Stat>& stats) {
    nb::list out;
    for (const auto& s : stats) {
        nb::dict d;
        d["port"] = s.port;
        d["egress"] = s.egress;
        d["seen"] = s.seen;
        d["dropped"] = s.dropped;
        d["delayed"] = s.delayed;
        d["duplicated"] = s.duplicated;
        d["reordered"] = s.reordered;
        d["loss"] = s.loss;
        d["duplicate"] = s.duplicate;
        d["reorder"] = s.reorder;
        d["delay_us"] = s.delay_us;
        d["jitter_us"] = s.jitter_us;
        out.append(d);
    }
    return out;
}

void bind_loop(nb::module_& m) {
    nb::class_<inagg::SwitchLoop>(m, "SwitchLoop",
                                  "The software switch's packet loop thread "
                                  "(native/switch_loop.hpp)")
        .def(nb::init<size_t>(), "capture_bytes"_a = inagg::SwitchLoop::kCaptureBytes,
             "capture_bytes: the bound of the captured frames waiting for take_captures()")
        .def("add_udp_ports", &inagg::SwitchLoop::add_udp_ports, "fd"_a, "bind_addr"_a, "peers"_a)
        .def("add_raw_port", &inagg::SwitchLoop::add_raw_port, "fd"_a, "port"_a)
        .def("capture", &inagg::SwitchLoop::capture, "port"_a,
             "Capture the frames `port` receives and sends (before start())")
        .def("take_captures", &take_captures,
             "The frames captured since the last call: [(port, 'in'|'out', usec, frame)]")
        .def("set_congestion_threshold", &inagg::SwitchLoop::set_congestion_threshold, "bytes"_a,
             "Mark results leaving by a raw port whose socket holds this many bytes unsent (0: "
             "never)")
        .def("set_impairment", &inagg::SwitchLoop::set_impairment, "port"_a, "egress"_a, "loss"_a,
             "delay_us"_a, "jitter_us"_a, "duplicate"_a, "reorder"_a,
             "Impair a port's frames in or out (port_impairment.hpp; before start())")
        .def("set_impairment_seed", &inagg::SwitchLoop::set_impairment_seed, "seed"_a)
        .def(
            "impairment_stats",
            [](const inagg::SwitchLoop& loop) { return stat_dicts(loop.impairment_stats()); },
            "[{port, egress, seen, dropped, ...}] of each impaired direction (as the twin's)")
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
            d["marked"] = s.marked.load();
            // captured frames the queue had no room for
            d["capture_dropped"] = loop.capture_dropped();
            return d;
        });
}

// The ports' impairments on their own, for the twin's tests (bmv2_env/softswitch/impair.py).
void bind_impairments(nb::module_& m) {
    using inagg::PortImpairments;
    nb::class_<PortImpairments>(
        m, "PortImpairments", "Seeded impairments per port direction (native/port_impairment.hpp)")
        .def(nb::init<uint64_t>(), "seed"_a = 0)
        .def("set_loss", &PortImpairments::set_loss, "port"_a, "egress"_a, "fraction"_a)
        .def("set_delay", &PortImpairments::set_delay, "port"_a, "egress"_a, "delay_us"_a)
        .def("set_jitter", &PortImpairments::set_jitter, "port"_a, "egress"_a, "jitter_us"_a)
        .def("set_duplicate", &PortImpairments::set_duplicate, "port"_a, "egress"_a, "fraction"_a)
        .def("set_reorder", &PortImpairments::set_reorder, "port"_a, "egress"_a, "fraction"_a)
        .def(
            "next",
            [](PortImpairments& p, uint16_t port, bool egress) {
                PortImpairments::Fate f = p.next(port, egress);
                return nb::make_tuple(f.dropped, f.delay_us, f.duplicated, f.copy_delay_us, f.n);
            },
            "port"_a, "egress"_a,
            "(dropped, delay_us, duplicated, copy_delay_us, n) of the port direction's next frame")
        .def("left", &PortImpairments::left, "port"_a, "egress"_a, "n"_a)
        .def("stats", [](const PortImpairments& p) { return stat_dicts(p.stats()); });
    m.def("impair_hash", &inagg::impair_hash, "seed"_a, "port"_a, "egress"_a, "n"_a, "salt"_a);
    using inagg::DelayLine;
    nb::class_<DelayLine>(m, "DelayLine",
                          "Frames held for their port's delay (port_impairment.hpp)")
        .def(nb::init<>())
        .def(
            "hold",
            [](DelayLine& d, int64_t release_us, uint16_t port, bool egress, uint64_t n,
               nb::bytes frame) {
                d.hold(release_us, port, egress, n, reinterpret_cast<const uint8_t*>(frame.c_str()),
                       frame.size());
            },
            "release_us"_a, "port"_a, "egress"_a, "n"_a, "frame"_a)
        .def("take_due", [](DelayLine& d, int64_t now_us) {
            nb::list due;
            for (const auto& f : d.take_due(now_us))
                due.append(nb::make_tuple(
                    f.port, f.egress, f.n,
                    nb::bytes(reinterpret_cast<const char*>(f.bytes.data()), f.bytes.size())));
            return due;
        });
}

}  // namespace

void bind_switch(nb::module_& m) {
    m.def("bound_sender_id", &inagg::bound_sender_id, "rank"_a,
          "The engine's id of a rank's sender once worker_table admitted it: the rank");
    m.def("unbound_sender_id", &inagg::unbound_sender_id, "rank"_a,
          "The engine's id for a rank no worker_table entry binds: no packet carries it");
    m.attr("SWITCH_LOOP_BATCH") = inagg::SwitchLoop::kBatch;
    m.attr("SWITCH_LOOP_CAPTURE_BYTES") = inagg::SwitchLoop::kCaptureBytes;
    bind_pipeline(m);
    bind_loop(m);
    bind_impairments(m);
}
