// Hostile: a template instantiation bomb. G<N, M, P> instantiates three smaller G's, so the
// front end materialises ~N^3/6 distinct classes: minutes and gigabytes of compiler memory at
// the default depth. The build's timeout and address-space cap must turn it into one verdict.
template <int N, int M, int P> struct G {
    static constexpr unsigned long long v =
        G<N - 1, M, P>::v + G<N - 1, M + 1, P>::v + G<N - 1, M, P + 1>::v + M * P;
};
template <int M, int P> struct G<0, M, P> { static constexpr unsigned long long v = M + P; };

#ifndef BOMB_DEPTH
#define BOMB_DEPTH 150
#endif
extern "C" unsigned long long bomb_value(void) { return G<BOMB_DEPTH, 0, 0>::v; }
