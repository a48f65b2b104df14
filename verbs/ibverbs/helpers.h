// Shared C helpers of the cgo files of package ibverbs: the rdma-core
// headers and the few static inline functions more than one file calls.
// Helpers used by one file live in that file's preamble.

#ifndef RDMAFS_IBVERBS_HELPERS_H
#define RDMAFS_IBVERBS_HELPERS_H

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static inline int set_nonblock(int fd) {
	int f = fcntl(fd, F_GETFL);
	if (f < 0) return -errno;
	return fcntl(fd, F_SETFL, f | O_NONBLOCK) < 0 ? -errno : 0;
}

static inline int make_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip, int iplen, int port) {
	memset(ss, 0, sizeof *ss);
	if (iplen == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip, 4);
		return 0;
	}
	if (iplen == 16) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		memcpy(&s->sin6_addr, ip, 16);
		return 0;
	}
	return -EINVAL;
}

// conn_param fills the connection parameters both sides of an RDMA-CM
// connection send: the private data (the provider's exchange) and the
// RDMA Read depths, with the most transport retries (7, the three-bit
// field's largest) and RNR retries without limit (7 means infinite).
static inline void conn_param(struct rdma_conn_param *p, const void *pd, int pdlen, int rr, int id_) {
	memset(p, 0, sizeof *p);
	p->private_data = pd;
	p->private_data_len = pdlen;
	p->responder_resources = rr;
	p->initiator_depth = id_;
	p->retry_count = 7;
	p->rnr_retry_count = 7;
}

// MAX_BINDS is the most window binds chained before one work request.
#define MAX_BINDS 32

// bind_arg is one memory-window bind chained before a work request.
struct bind_arg {
	struct ibv_mw *mw;
	struct ibv_mr *mr;
	uint64_t addr;
	uint64_t len;
	uint32_t rkey;
	int access;
};

// fill_binds fills wrs[0..nb) with unsignaled type-2 window binds, each
// linked to the next work request.
static inline void fill_binds(struct ibv_send_wr *wrs, const struct bind_arg *b, int nb) {
	for (int i = 0; i < nb; i++) {
		memset(&wrs[i], 0, sizeof wrs[i]);
		wrs[i].opcode = IBV_WR_BIND_MW;
		wrs[i].bind_mw.mw = b[i].mw;
		wrs[i].bind_mw.rkey = b[i].rkey;
		wrs[i].bind_mw.bind_info.mr = b[i].mr;
		wrs[i].bind_mw.bind_info.addr = b[i].addr;
		wrs[i].bind_mw.bind_info.length = b[i].len;
		wrs[i].bind_mw.bind_info.mw_access_flags = b[i].access;
		wrs[i].next = &wrs[i + 1];
	}
}

// post_binds posts nb window binds alone; the last is signaled with wrid.
static inline int post_binds(struct ibv_qp *qp, const struct bind_arg *b, int nb, uint64_t wrid) {
	struct ibv_send_wr wrs[MAX_BINDS + 1], *bad;
	if (nb < 1 || nb > MAX_BINDS) return EINVAL;
	fill_binds(wrs, b, nb);
	wrs[nb - 1].next = NULL;
	wrs[nb - 1].wr_id = wrid;
	wrs[nb - 1].send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(qp, &wrs[0], &bad);
}

// post_local_inv posts a signaled local invalidation of rkey.
static inline int post_local_inv(struct ibv_qp *qp, uint64_t wrid, uint32_t rkey) {
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wrid;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

// set_mw_rkey records the key a posted bind gives a type-2 window: the
// next bind names the window by it (rxe checks it), and libibverbs
// updates it only for type-1 binds (ibv_bind_mw).
static inline void set_mw_rkey(struct ibv_mw *mw, uint32_t rkey) { mw->rkey = rkey; }

static inline const char *dev_name(struct ibv_context *c) { return ibv_get_device_name(c->device); }
static inline int errno_of(void) { return errno; }

#endif
