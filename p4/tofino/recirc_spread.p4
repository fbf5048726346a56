/* RecircSpread (Tofino): which port a packet's second pass recirculates through. A pipe has one
 * recirculation port (RECIRC_PORT_LOCAL, 100 Gb/s on Tofino 1); a pipe whose jobs need more
 * recirculates through front-panel ports in loopback too (SwitchML uses seven): the operator
 * puts some of the pipe's reserved ports (types.p4: LOOPBACK_BASE, the parser takes second
 * passes there; @inagg_recirculation_ports tells the controller which) in loopback and names them,
 * and the controller writes their rows here (controller/switch.py: RecircSpread):
 *
 *   recirc_spread (pipe, slot's low TOFINO_RECIRC_SPREAD_BITS) | meta.recirc_port
 *   ------------------------------------------------------------+------------------------------
 *   a row the controller wrote: via(port)                       | that port (of the same pipe)
 *   no row (the default): via_pipe_port                         | pipe ++ RECIRC_PORT_LOCAL
 *
 * Keyed by the slot, never by the packet: every pass of one slot (a result, an answer, an undo;
 * either set) takes the same port, so they stay in that port's FIFO order, on which the second
 * passes' correctness rests (docs/tofino.md, "Recirculation capacity"); slots spread over the
 * ports by their low bits, as a job's slots are consecutive. The port is in the packet's own
 * pipe (the controller refuses another), so each pipe's recirc_sent and recirc_arrived count
 * its own ports. Applied to every packet: no key waits on another table, so it takes no stage
 * of the slot logic's. */
#ifndef _INAGG_TOFINO_RECIRC_SPREAD_P4_
#define _INAGG_TOFINO_RECIRC_SPREAD_P4_

#include "types.p4"

control RecircSpread(in tofino_headers_t hdr, inout tofino_ingress_md_t meta,
                     in ingress_intrinsic_metadata_t ig_intr_md) {
    action via(PortId_t port) {
        meta.recirc_port = port;
    }

    action via_pipe_port() {
        meta.recirc_port = ig_intr_md.ingress_port[8:7] ++ RECIRC_PORT_LOCAL;
    }

    /* for the controller: RECIRC_PORT_LOCAL, LOOPBACK_BASE, LOOPBACK_MASK (types.p4) */
#if __TARGET_TOFINO__ == 2
    @inagg_recirculation_ports(6, 64, 0x78)
#else
    @inagg_recirculation_ports(68, 56, 0x78)
#endif
    table recirc_spread {
        key = {
            ig_intr_md.ingress_port[8:7]: exact @name("pipe");
            hdr.inagg.slot[TOFINO_RECIRC_SPREAD_BITS - 1:0]: exact @name("slot_low");
        }
        actions = { via; @defaultonly via_pipe_port; }
        const default_action = via_pipe_port();
        size = TOFINO_RECIRC_SPREAD_ROWS;
    }

    apply {
        recirc_spread.apply();
    }
}

#endif /* _INAGG_TOFINO_RECIRC_SPREAD_P4_ */
