import streamlit as st

st.title("Spectral-norm bounds")
