# kproxy's flags and KubeProxyConfiguration file handling, as a library for the kproxy program
# and its unit tests. Included from cli/CMakeLists.txt.
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

add_library(kproxy_cli_options STATIC
  ${CMAKE_CURRENT_LIST_DIR}/duration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/feature_gates.cpp
  ${CMAKE_CURRENT_LIST_DIR}/net_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/proxy_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/config_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/validation.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flags.cpp
  ${CMAKE_CURRENT_LIST_DIR}/logging_setup.cpp
)
# The headers are private to cli/ (the program and its tests), not installed.
target_include_directories(kproxy_cli_options PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(kproxy_cli_options
  PUBLIC kproxy_core
  PRIVATE kproxy_net yaml-cpp nlohmann_json::nlohmann_json fmt::fmt kproxy_warnings)
