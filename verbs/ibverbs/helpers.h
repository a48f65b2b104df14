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

static inline const char *dev_name(struct ibv_context *c) { return ibv_get_device_name(c->device); }
static inline int errno_of(void) { return errno; }

#endif
