/* An IPv4 socket address from text, for the C tests of the drop-in's librdmacm. */
#ifndef REMEM_TEST_INET_H
#define REMEM_TEST_INET_H

#include <arpa/inet.h>
#include <string.h>

static inline struct sockaddr_in addr(const char *ip, int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

#endif
