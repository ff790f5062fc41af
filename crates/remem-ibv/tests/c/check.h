/* What the C tests of the drop-in share: CHECK prints one line per check and counts the
 * failures; REQUIRE also stops at a failure (`cond` is evaluated once). A test prints
 * "N failures" at the end and exits 1 if N > 0. */
#ifndef REMEM_TEST_CHECK_H
#define REMEM_TEST_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (cond) {                                                     \
			printf("ok   %s\n", #cond);                             \
		} else {                                                        \
			printf("FAIL %s (line %d, errno %d %s): ", #cond,       \
			       __LINE__, errno, strerror(errno));               \
			printf(__VA_ARGS__);                                    \
			printf("\n");                                           \
			failures++;                                             \
		}                                                               \
	} while (0)

#define REQUIRE(cond, ...)                                                      \
	do {                                                                    \
		int before_ = failures;                                         \
		CHECK(cond, __VA_ARGS__);                                       \
		if (failures != before_) {                                      \
			printf("%d failures\n", failures);                      \
			exit(1);                                                \
		}                                                               \
	} while (0)

#endif
