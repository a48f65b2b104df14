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

static inline const char *dev_name(struct ibv_context *c) { return ibv_get_device_name(c->device); }
static inline int errno_of(void) { return errno; }

#endif
