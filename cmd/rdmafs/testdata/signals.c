// signals: system calls on a mount while signals arrive (signals_test.go).
//
//   signals restart DIR  stat DIR/absent, open DIR/ofile, rename DIR/ra to
//                        DIR/rb and read DIR/rfile (opened first), each in
//                        a thread of its own, while another thread sends
//                        each of them SIGUSR1 every 2 ms; the handler is
//                        installed with SA_RESTART. Prints "ready", waits
//                        for a line on stdin, prints "started", then one
//                        line per call: "NAME ret=R errno=E signals=N".
//   signals lockwait FILE  a child takes a write lock on FILE (fcntl
//                        F_SETLK, then flock LOCK_EX); the parent, with a
//                        SIGUSR1 handler without SA_RESTART, waits for the
//                        lock (F_SETLKW, then flock without LOCK_NB) while
//                        SIGUSR1 comes every 50 ms. Prints
//                        "setlkw ret=R errno=E" and "flock ret=R errno=E".
//   signals block OP PATH  prints "ready", waits for a line on stdin, then
//                        does OP (stat or unlink) on PATH and prints
//                        "OP ret=R errno=E".
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// handled counts the signals handled by each thread.
static __thread int handled;

static void on_usr1(int sig)
{
	(void)sig;
	handled++;
}

static void handle_usr1(int flags)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL) != 0) {
		perror("sigaction");
		exit(2);
	}
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void wait_line(void)
{
	char line[64];
	if (fgets(line, sizeof line, stdin) == NULL) {
		fprintf(stderr, "stdin closed\n");
		exit(2);
	}
}

static char *path(const char *dir, const char *name)
{
	char *p;
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		exit(2);
	return p;
}

enum { OP_STAT, OP_OPEN, OP_RENAME, OP_READ, NOPS };

static const char *op_names[NOPS] = {"stat", "open", "rename", "read"};

struct op {
	int which;
	pthread_t th;
	atomic_int done;
	long ret;
	int err;
	int signals;
};

static const char *dir;
static int rfd;
static atomic_int stop;

static void *run_op(void *arg)
{
	struct op *op = arg;
	struct stat st;
	char buf[4096];
	int before = handled;

	errno = 0;
	switch (op->which) {
	case OP_STAT:
		op->ret = stat(path(dir, "absent"), &st);
		break;
	case OP_OPEN:
		op->ret = open(path(dir, "ofile"), O_RDONLY);
		break;
	case OP_RENAME:
		op->ret = rename(path(dir, "ra"), path(dir, "rb"));
		break;
	case OP_READ:
		op->ret = pread(rfd, buf, sizeof buf, 0);
		break;
	}
	op->err = op->ret < 0 ? errno : 0;
	// The handler has run once the call returned, for each signal that
	// arrived during it (one at least: SIGUSR1 comes every 2 ms).
	op->signals = handled - before;
	atomic_store(&op->done, 1);
	return NULL;
}

static int restart(void)
{
	struct op ops[NOPS];

	handle_usr1(SA_RESTART);
	rfd = open(path(dir, "rfile"), O_RDONLY);
	if (rfd < 0) {
		perror("open rfile");
		return 2;
	}
	printf("ready\n");
	fflush(stdout);
	wait_line();
	memset(ops, 0, sizeof ops);
	for (int i = 0; i < NOPS; i++) {
		ops[i].which = i;
		if (pthread_create(&ops[i].th, NULL, run_op, &ops[i]) != 0) {
			perror("pthread_create");
			return 2;
		}
	}
	printf("started\n");
	fflush(stdout);
	for (int all = 0; !all;) {
		all = 1;
		for (int i = 0; i < NOPS; i++) {
			if (!atomic_load(&ops[i].done)) {
				all = 0;
				pthread_kill(ops[i].th, SIGUSR1);
			}
		}
		sleep_ms(2);
	}
	for (int i = 0; i < NOPS; i++) {
		pthread_join(ops[i].th, NULL);
		printf("%s ret=%ld errno=%d signals=%d\n", op_names[i], ops[i].ret, ops[i].err, ops[i].signals);
	}
	return 0;
}

static pthread_t waiter;

static void *signaller(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		sleep_ms(50);
		pthread_kill(waiter, SIGUSR1);
	}
	return NULL;
}

// lockwait_one has a child hold a lock on file (taken with flock if
// use_flock, else fcntl) and waits for it with signals arriving.
static void lockwait_one(const char *file, int use_flock)
{
	int ready[2], hold[2];
	if (pipe(ready) != 0 || pipe(hold) != 0) {
		perror("pipe");
		exit(2);
	}
	pid_t child = fork();
	if (child == 0) {
		close(ready[0]);
		close(hold[1]);
		int fd = open(file, O_RDWR);
		if (fd < 0) {
			perror("child open");
			_exit(1);
		}
		struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
		if ((use_flock ? flock(fd, LOCK_EX | LOCK_NB) : fcntl(fd, F_SETLK, &fl)) != 0) {
			perror("child lock");
			_exit(1);
		}
		if (write(ready[1], "l", 1) != 1)
			_exit(1);
		char c;
		(void)read(hold[0], &c, 1); // until the parent closes it
		_exit(0);
	}
	close(ready[1]);
	close(hold[0]);
	char c;
	if (read(ready[0], &c, 1) != 1) {
		fprintf(stderr, "child did not lock\n");
		exit(2);
	}
	int fd = open(file, O_RDWR);
	if (fd < 0) {
		perror("open");
		exit(2);
	}
	waiter = pthread_self();
	atomic_store(&stop, 0);
	pthread_t sig;
	pthread_create(&sig, NULL, signaller, NULL);
	struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
	errno = 0;
	int r = use_flock ? flock(fd, LOCK_EX) : fcntl(fd, F_SETLKW, &fl);
	int err = r < 0 ? errno : 0;
	atomic_store(&stop, 1);
	pthread_join(sig, NULL);
	printf("%s ret=%d errno=%d\n", use_flock ? "flock" : "setlkw", r, err);
	fflush(stdout);
	close(hold[1]);
	waitpid(child, NULL, 0);
	close(fd);
}

static int block(const char *op, const char *p)
{
	struct stat st;
	printf("ready\n");
	fflush(stdout);
	wait_line();
	errno = 0;
	int r = strcmp(op, "unlink") == 0 ? unlink(p) : stat(p, &st);
	printf("%s ret=%d errno=%d\n", op, r, r < 0 ? errno : 0);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && strcmp(argv[1], "restart") == 0) {
		dir = argv[2];
		return restart();
	}
	if (argc == 3 && strcmp(argv[1], "lockwait") == 0) {
		handle_usr1(0);
		lockwait_one(argv[2], 0);
		lockwait_one(argv[2], 1);
		return 0;
	}
	if (argc == 4 && strcmp(argv[1], "block") == 0)
		return block(argv[2], argv[3]);
	fprintf(stderr, "usage: signals restart DIR | lockwait FILE | block stat|unlink PATH\n");
	return 2;
}
