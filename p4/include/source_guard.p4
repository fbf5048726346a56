/* SourceGuard: a host cannot pass itself off as an aggregator (docs/security.md).
 *
 * A worker takes a result only from its grant's aggregator address, and nothing in a result is
 * secret; so a host that could send frames from the switch's aggregator address could forge
 * results. host_port_table marks the ports that face hosts (the controller writes one entry
 * per port of its config's `hosts`; ports to other switches, the tree links of docs/trees.md,
 * have none and are not guarded: a child's sums and a parent's results arrive there). On a
 * host port the switch drops and counts (guard_drops, by GUARD_DROP_*):
 *
 *   frame on a host port                                  | verdict
 *   ------------------------------------------------------+-------------------------------------
 *   IPv4 source = the switch's aggregator address         | drop GUARD_DROP_AGGREGATOR_ADDR
 *   IPv4 source = the host aggregator's address, and the  | drop GUARD_DROP_AGGREGATOR_ADDR
 *   port is not the host aggregator's                      |
 *   inagg RESULT, port not the host aggregator's          | drop GUARD_DROP_RESULT
 *   inagg FLAG_FROM_SWITCH (a switch's partial sum)       | drop GUARD_DROP_RESULT
 *   anything else, or a port with no entry                | on to TreeUplink / JobAdmission
 *
 * The host aggregator (host-mode jobs) sends its results from its own port: that port's entry
 * has aggregator_port = 1. Results the switch makes leave it; they never enter a host port.
 */
#ifndef _INAGG_SOURCE_GUARD_P4_
#define _INAGG_SOURCE_GUARD_P4_

#include <core.p4>
#include <v1model.p4>
#include "types.p4"

control SourceGuard(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t sm) {
    counter((bit<32>) GUARD_DROP_REASONS, CounterType.packets) guard_drops;
    bool host_port = false;
    bit<32> switch_addr = 0;
    bit<32> host_aggregator_addr = 0;
    bit<1> aggregator_port = 0;

    action guard_host_port(bit<32> aggregator_addr, bit<32> host_aggregator, bit<1> is_aggregator) {
        host_port = true;
        switch_addr = aggregator_addr;
        host_aggregator_addr = host_aggregator;
        aggregator_port = is_aggregator;
    }

    table host_port_table {
        key = { sm.ingress_port: exact @name("port"); }
        actions = { guard_host_port; NoAction; }
        default_action = NoAction();
        size = INAGG_HOST_PORT_TABLE_SIZE;
    }

    apply {
        meta.guard_drop = 0;
        host_port_table.apply();
        if (!host_port) {
            return;
        }
        if (hdr.ipv4.isValid() && (hdr.ipv4.src_addr == switch_addr
                                   || (aggregator_port == 0
                                       && hdr.ipv4.src_addr == host_aggregator_addr))) {
            meta.guard_drop = 1;
            guard_drops.count((bit<32>) GUARD_DROP_AGGREGATOR_ADDR);
        } else if (hdr.inagg.isValid()
                   && ((hdr.inagg.msg_type == MSG_RESULT && aggregator_port == 0)
                       || (hdr.inagg.flags & FLAG_FROM_SWITCH) != 0)) {
            meta.guard_drop = 1;
            guard_drops.count((bit<32>) GUARD_DROP_RESULT);
        }
    }
}

#endif /* _INAGG_SOURCE_GUARD_P4_ */
