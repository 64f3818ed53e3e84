#pragma once
/// Include Boost.Asio/Beast through this header only. Debian's Boost 1.74 Asio uses
/// std::exchange without including <utility>, which C++20/23 standard libraries no longer pull
/// in transitively; including it first here fixes that once for the whole project.

#include <utility>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
