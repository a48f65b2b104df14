// mtablock DIR ROUNDS: takes turns at DIR/lock the way mount(8)'s old
// mtab lock did (xfstests' t_mtab, generic/089): create a temporary
// file, link(2) it to the lock name, open the lock name, fcntl(F_SETLK),
// later unlink the lock name. An open that finds the name gone (ENOENT)
// and a lock another process holds (EAGAIN, EACCES) are what such
// programs expect and retry; any other error is printed as
// "error CALL ERRNO" and counted. Prints "done ROUNDS ERRORS" at the end.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int errors;

static void fail(const char *call, int err)
{
	printf("error %s %d %s\n", call, err, strerror(err));
	errors++;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: mtablock DIR ROUNDS\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	char lock[4096], tmp[4096];
	snprintf(lock, sizeof lock, "%s/lock", argv[1]);
	snprintf(tmp, sizeof tmp, "%s/lock.%d", argv[1], getpid());
	int rounds = atoi(argv[2]);
	for (int r = 0; r < rounds; r++) {
		int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0) {
			fail("create", errno);
			continue;
		}
		close(fd);
		for (int held = 0; !held;) {
			if (link(tmp, lock) == 0)
				held = 1;
			else if (errno != EEXIST) {
				fail("link", errno);
				break;
			}
			fd = open(lock, O_WRONLY);
			if (fd < 0) {
				if (errno != ENOENT)
					fail("open", errno);
				held = 0;
				continue;
			}
			struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
			if (fcntl(fd, F_SETLK, &fl) != 0 && errno != EAGAIN && errno != EACCES)
				fail("fcntl", errno);
			if (held) {
				if (unlink(lock) != 0)
					fail("unlink lock", errno);
			}
			close(fd);
		}
		if (unlink(tmp) != 0)
			fail("unlink tmp", errno);
	}
	printf("done %d %d\n", rounds, errors);
	return 0;
}
